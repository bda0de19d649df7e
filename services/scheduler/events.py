"""Protobuf ↔ domain conversions for what arrives over NATS (heartbeats, KV events, replays)."""

from __future__ import annotations

from kvmesh.runtime.pb import events_pb2

from .index import Cleared, Event, EventBatch, Removed, Replay, Stored
from .registry import HeartbeatInfo, Role


def heartbeat_from_pb(hb: events_pb2.Heartbeat) -> HeartbeatInfo:
    if hb.role not in tuple(Role):
        raise ValueError(f"heartbeat from {hb.worker_id!r} has no valid role ({hb.role})")
    return HeartbeatInfo(
        worker_id=hb.worker_id,
        role=Role(hb.role),
        endpoint=hb.endpoint,
        pool=hb.pool or "production",
        model=hb.model,
        block_size=hb.block_size,
        num_running=hb.num_running,
        num_waiting=hb.num_waiting,
        kv_blocks_total=hb.kv_blocks_total,
        kv_blocks_free=hb.kv_blocks_free,
        max_num_seqs=hb.max_num_seqs,
        started_at=hb.started_at,
        draining=hb.draining,
        kv_event_seq=hb.kv_event_seq,
        live_request_ids=frozenset(hb.live_requests.request_ids) if hb.HasField("live_requests") else None,
        max_model_len=hb.max_model_len,
        engine_progress=hb.engine_progress if hb.reports_progress else None,
    )


def event_from_pb(event: events_pb2.KvEvent) -> Event:
    kind = event.WhichOneof("event")
    if kind == "stored":
        return Stored(tuple(event.stored.block_hashes), event.stored.parent_hash or None)
    if kind == "removed":
        return Removed(tuple(event.removed.block_hashes))
    if kind == "cleared":
        return Cleared()
    raise ValueError("KV event without a kind")


def batch_from_pb(batch: events_pb2.KvEventBatch, worker_id: str = "") -> EventBatch:
    events = tuple(event_from_pb(e) for e in batch.events if e.WhichOneof("event"))
    return EventBatch(batch.worker_id or worker_id, batch.seq, events)


def replay_from_pb(reply: events_pb2.KvReplayReply, worker_id: str) -> Replay:
    return Replay(
        batches=tuple(batch_from_pb(b, worker_id) for b in reply.batches if (b.worker_id or worker_id) == worker_id),
        full_dump=reply.full_dump,
        held=tuple(reply.held),
        seq=reply.seq,
    )
