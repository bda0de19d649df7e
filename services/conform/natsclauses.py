"""Clauses every NATS publisher shares (prefill, decode, kvstore): heartbeats, KV events,
replay, and deregistration on drain. Each role registers them under its own numbers."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc

from kvmesh.runtime.pb import common_pb2

from .clauses import expect
from .probe import Watcher, health_status, need, wait_for

ROLE_ENUM = {"prefill": common_pb2.WORKER_ROLE_PREFILL, "decode": common_pb2.WORKER_ROLE_DECODE,
             "kvstore": common_pb2.WORKER_ROLE_KVSTORE}
MAX_PERIOD_S = 2.0  # contracts.md: a heartbeat at least every 2 s


def watcher_of(ctx) -> Watcher:  # noqa: ANN001 - any role's session
    need(ctx.watcher, "needs --nats (the implementation's NATS server)")
    return ctx.watcher


async def check_heartbeat(ctx, role: str) -> None:  # noqa: ANN001
    """Subject, identity, fields, and a period of at most MAX_PERIOD_S."""
    watcher = watcher_of(ctx)
    worker_id = await watcher.worker_id(ctx.endpoint)
    first = len(watcher.beats_of(ctx.endpoint))
    await wait_for(lambda: len(watcher.beats_of(ctx.endpoint)) >= first + 2, 2 * MAX_PERIOD_S + 0.5)
    beats = watcher.beats_of(ctx.endpoint)
    expect(len(beats) >= first + 2, f"fewer than 2 heartbeats in {2 * MAX_PERIOD_S + 0.5:g}s (period must be <= {MAX_PERIOD_S:g}s)")
    for beat in beats:
        hb = beat.message
        expect(beat.subject == f"kvmesh.workers.{role}.{hb.worker_id}.heartbeat",
               f"heartbeat of {hb.worker_id!r} arrived on {beat.subject}")
        expect(hb.worker_id == worker_id, f"worker_id changed from {worker_id!r} to {hb.worker_id!r}")
        expect(hb.role == ROLE_ENUM[role], f"role is {common_pb2.WorkerRole.Name(hb.role)}, expected {common_pb2.WorkerRole.Name(ROLE_ENUM[role])}")
        expect(hb.block_size > 0, "block_size is 0")
        expect(hb.model, "model is empty")
        expect(hb.started_at > 0 and hb.timestamp >= hb.started_at, "timestamp must be unix seconds >= started_at > 0")
        if role != "kvstore":
            expect(hb.max_num_seqs > 0, "max_num_seqs is 0")
            expect(hb.kv_blocks_free <= hb.kv_blocks_total, "kv_blocks_free > kv_blocks_total")
            expect(hb.pool, "pool is empty")
    recent = beats[first:]
    expect(len({b.message.started_at for b in recent}) == 1, "started_at changed without a restart")
    stamps = [b.message.timestamp for b in recent]
    expect(stamps == sorted(stamps), "timestamps go backwards")
    gaps = [b.received_at - a.received_at for a, b in zip(recent, recent[1:])]
    expect(max(gaps) <= MAX_PERIOD_S + 0.5, f"{max(gaps):.2f}s between heartbeats (at most {MAX_PERIOD_S:g}s)")
    ctx.worker_id = worker_id


async def check_kv_events(ctx) -> None:  # noqa: ANN001
    """Batches on kvmesh.kv.events.<worker_id>: seq +1 per batch, well-formed events, and the
    heartbeat's kv_event_seq catches up with the last batch."""
    watcher = watcher_of(ctx)
    worker_id = ctx.worker_id or await watcher.worker_id(ctx.endpoint)
    batches = watcher.batches.get(worker_id, [])
    need(batches, f"{worker_id} published no KV events (it announces no cache)")
    seqs = [b.seq for b in batches]
    expect(seqs[0] >= 1, "sequence numbers start at 1")
    expect(seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"sequence numbers not +1 per batch: {seqs[:20]}")
    for batch in batches:
        expect(batch.worker_id in ("", worker_id), f"batch {batch.seq} names worker {batch.worker_id!r}")
        for event in batch.events:
            kind = event.WhichOneof("event")
            expect(kind in ("stored", "removed", "cleared"), f"batch {batch.seq} has an empty event")
            hashes = event.stored.block_hashes if kind == "stored" else event.removed.block_hashes if kind == "removed" else []
            expect(all(len(h) == 32 for h in hashes), f"batch {batch.seq}: block hashes must be 32 bytes")
    last = seqs[-1]
    caught_up = await wait_for(lambda: watcher.beats_of(ctx.endpoint)[-1].message.kv_event_seq >= last, 3 * MAX_PERIOD_S)
    expect(caught_up, f"heartbeat kv_event_seq {watcher.beats_of(ctx.endpoint)[-1].message.kv_event_seq} never reached {last}")


async def check_replay(ctx) -> None:  # noqa: ANN001
    """Replay from a seen seq returns those batches (or a full dump); from beyond the end, none."""
    watcher = watcher_of(ctx)
    worker_id = ctx.worker_id or await watcher.worker_id(ctx.endpoint)
    batches = watcher.batches.get(worker_id, [])
    need(batches, f"{worker_id} published no KV events, so it owes no replays")
    first = batches[0].seq
    reply = await watcher.replay(worker_id, first)
    expect(reply.seq >= batches[-1].seq, f"replay reply seq {reply.seq} is behind the last batch {batches[-1].seq}")
    if reply.full_dump:
        expect(all(len(h) == 32 for h in reply.held), "full dump holds hashes that are not 32 bytes")
    else:
        got = {b.seq: b.SerializeToString() for b in reply.batches}
        expect(sorted(got) == list(range(first, reply.seq + 1)), f"replay from {first} returned seqs {sorted(got)}")
        for batch in batches:
            expect(got.get(batch.seq) == batch.SerializeToString(), f"replayed batch {batch.seq} differs from the one published")
    ahead = await watcher.replay(worker_id, reply.seq + 10)
    expect(not ahead.batches and not ahead.full_dump, "a replay from beyond the last seq must return nothing")


async def check_drain(ctx, role: str, inflight=None) -> None:  # noqa: ANN001
    """SIGTERM: a heartbeat with draining=true, health stops SERVING, in-flight work finishes."""
    need(ctx.opts.drain_pid, "needs --drain-pid (the suite sends SIGTERM to that process)")
    watcher = watcher_of(ctx)
    worker_id = ctx.worker_id or await watcher.worker_id(ctx.endpoint)
    task = asyncio.create_task(inflight()) if inflight else None
    if task:
        await asyncio.sleep(0.3)
    os.kill(ctx.opts.drain_pid, signal.SIGTERM)
    drained = await wait_for(lambda: any(b.message.draining for b in watcher.beats_of(ctx.endpoint)), 5.0)
    expect(drained, f"no heartbeat with draining=true from {worker_id} within 5s of SIGTERM")
    try:
        status = await health_status(ctx.channel)
        expect(status != 1, "health still SERVING after SIGTERM")
    except grpc.aio.AioRpcError:
        pass  # the server is gone: not serving either
    if task:
        await task
