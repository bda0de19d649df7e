"""Suite of the scheduler role (clauses S1.. of docs/contracts.md). The suite plays the workers:
fake heartbeats, KV event batches and replay answers on the implementation's NATS."""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from dataclasses import dataclass, field

import grpc

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.pb import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc

from .clauses import Registry, expect, expect_status
from .fakeworkers import FakeWorker, batch_of, stored
from .probe import channel, expect_serving, need, wait_for

REGISTRY = Registry("scheduler", "S")
clause = REGISTRY.clause
INVALID, UNAVAILABLE = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE
DECODE, PREFILL = common_pb2.WORKER_ROLE_DECODE, common_pb2.WORKER_ROLE_PREFILL
EXPIRY_S = 10.0      # contracts.md S15: a silent worker is dropped within this
RECONCILE_S = 30.0   # contracts.md S16: a routed request its worker no longer holds is released within this


@dataclass(slots=True)
class Session:
    opts: object
    channel: grpc.aio.Channel
    stub: scheduler_pb2_grpc.SchedulerStub
    bus: Bus | None
    pool: str
    hasher: BlockHasher
    workers: dict[str, FakeWorker] = field(default_factory=dict)
    last_request_id: str = ""

    def tokens(self, salt: str, blocks: int) -> list[int]:
        return [(zlib.crc32(salt.encode()) + i * 7919) % 30_000 for i in range(blocks * self.hasher.block_size)]

    async def worker(self, name: str, role: int = DECODE, **fields) -> FakeWorker:
        need(self.bus, "needs --nats (the suite plays the workers on NATS)")
        if name not in self.workers:
            w = FakeWorker(self.bus, f"{name}-{self.pool}", role, self.pool, self.opts.model or "conform-model",
                           self.hasher.block_size, **fields)
            await w.start()
            self.workers[name] = w
        return self.workers[name]

    async def route(self, *, hashes: list[bytes] = (), tokens: int = 0, exclude: list[str] = (), pool: str | None = None,
                    complete: bool = True) -> scheduler_pb2.RouteResponse:
        """Route then Complete (so no admission slot is held)."""
        request_id = self.last_request_id = f"conform-{uuid.uuid4().hex[:12]}"
        bs = self.hasher.block_size
        reply = await self.stub.Route(scheduler_pb2.RouteRequest(
            request_id=request_id, num_prompt_tokens=tokens or max(bs * len(hashes) + 1, 8), block_hashes=hashes,
            max_tokens=16, pool=self.pool if pool is None else pool, exclude_workers=exclude, model=self.opts.model,
        ), timeout=10)
        if complete:
            await self.stub.Complete(scheduler_pb2.CompleteRequest(request_id=request_id, status="ok"), timeout=10)
        return reply

    async def listed(self) -> dict[str, scheduler_pb2.WorkerStatus]:
        reply = await self.stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=10)
        return {w.worker_id: w for w in reply.workers}

    async def until_replay(self, w: FakeWorker, count: int, timeout_s: float = 5.0) -> int:
        ok = await wait_for(lambda: len(w.replay_requests) >= count, timeout_s)
        expect(ok, f"no KvReplayRequest on kvmesh.kv.replay.{w.worker_id} within {timeout_s:g}s")
        return w.replay_requests[count - 1]

    async def cached(self, hashes: list[bytes], want: int, timeout_s: float = 3.0) -> int:
        """decode_cached_blocks of a Route for `hashes`, polled until it equals `want` (or time is up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = (await self.route(hashes=hashes)).decode_cached_blocks
            if got == want or time.monotonic() > deadline:
                return got
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        for w in self.workers.values():
            await w.stop()
        if self.bus:
            await self.bus.close()
        await self.channel.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    chan = channel(opts.endpoint)
    bus = await Bus.connect(opts.nats, "conform-scheduler") if opts.nats else None
    hasher = BlockHasher(opts.model or "conform-model", opts.dtype, opts.block_size)
    return Session(opts, chan, scheduler_pb2_grpc.SchedulerStub(chan), bus, f"conform-{uuid.uuid4().hex[:8]}", hasher)


@clause(1, "health: grpc.health.v1 answers SERVING for the server and kvmesh.v1.Scheduler")
async def health(ctx: Session) -> None:
    await expect_serving(ctx.channel, ("kvmesh.v1.Scheduler",))


@clause(2, "Route refuses bad input with INVALID_ARGUMENT (no request_id, no tokens, bad or too many hashes)")
async def route_invalid(ctx: Session) -> None:
    bs = ctx.hasher.block_size
    cases = {
        "no request_id": scheduler_pb2.RouteRequest(num_prompt_tokens=10),
        "num_prompt_tokens 0": scheduler_pb2.RouteRequest(request_id="conform-x"),
        "an empty block hash": scheduler_pb2.RouteRequest(request_id="conform-x", num_prompt_tokens=bs, block_hashes=[b""]),
        "more hashes than full blocks": scheduler_pb2.RouteRequest(
            request_id="conform-x", num_prompt_tokens=bs, block_hashes=[bytes(32), bytes([1]) * 32]),
    }
    for what, request in cases.items():
        request.pool = ctx.pool
        await expect_status(ctx.stub.Route(request, timeout=10), INVALID, what=f"Route with {what}")


@clause(3, "Route to a pool without decode workers fails UNAVAILABLE")
async def route_empty_pool(ctx: Session) -> None:
    await expect_status(ctx.route(pool=f"{ctx.pool}-empty"), UNAVAILABLE, what="Route to an empty pool")


@clause(4, "a heartbeat registers a worker: ListWorkers shows its id, role, endpoint and pool within 3 s")
async def registration(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    listed: dict = {}

    async def poll() -> bool:
        listed.update(await ctx.listed())
        return d1.worker_id in listed

    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not await poll():
        await asyncio.sleep(0.1)
    expect(d1.worker_id in listed, f"{d1.worker_id} not in ListWorkers 3s after its heartbeat")
    w = listed[d1.worker_id]
    expect((w.role, w.endpoint, w.pool) == (DECODE, d1.endpoint, ctx.pool),
           f"listed as role={w.role} endpoint={w.endpoint} pool={w.pool}")


@clause(5, "Route picks a live decode worker of the asked pool and names it (id and endpoint); prefill iff not local")
async def route_happy(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    reply = await ctx.route(hashes=[])
    expect((reply.decode.worker_id, reply.decode.endpoint) == (d1.worker_id, d1.endpoint), f"routed to {reply.decode}")
    expect(reply.pool == ctx.pool, f"answered pool {reply.pool!r}, asked {ctx.pool!r}")
    expect(reply.local_prefill and not reply.HasField("prefill"), "no prefill worker exists, yet local_prefill is false")
    p1 = await ctx.worker("p1", PREFILL)
    await asyncio.sleep(0.5)
    long = await ctx.route(tokens=4096)
    if not long.local_prefill:
        expect(long.prefill.worker_id == p1.worker_id, f"prefill named {long.prefill.worker_id}, not a prefill worker of the pool")
    expect(long.local_prefill != long.HasField("prefill"), "prefill must be set exactly when local_prefill is false")


@clause(6, "exclude_workers is honoured; with every decode worker excluded Route fails UNAVAILABLE")
async def exclude(ctx: Session) -> None:
    d1, d2 = await ctx.worker("d1"), await ctx.worker("d2")
    await asyncio.sleep(0.5)
    expect((await ctx.route(exclude=[d1.worker_id])).decode.worker_id == d2.worker_id, "excluded worker was chosen")
    await expect_status(ctx.route(exclude=[d1.worker_id, d2.worker_id]), UNAVAILABLE, what="Route with all excluded")


@clause(7, "a worker whose heartbeat says draining is never routed to")
async def draining(ctx: Session) -> None:
    d1, d2 = await ctx.worker("d1"), await ctx.worker("d2")
    d2.draining = True
    await d2.beat()
    await asyncio.sleep(0.3)
    for _ in range(6):
        expect((await ctx.route()).decode.worker_id == d1.worker_id, "a draining worker was chosen")
    await expect_status(ctx.route(exclude=[d1.worker_id]), UNAVAILABLE, what="Route with only a draining worker left")


@clause(8, "KV events count: blocks a worker announced are reported as decode_cached_blocks")
async def kv_events(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    hashes = ctx.hasher.hashes(ctx.tokens("s8", 4))
    await d1.publish(1, stored(hashes[:3]))
    got = await ctx.cached(hashes, 3)
    expect(got == 3, f"3 of 4 blocks announced by {d1.worker_id}, Route says {got} cached")


@clause(9, "a sequence gap makes the scheduler ask kvmesh.kv.replay.<id> from the first missing seq and apply the reply")
async def gap_replay(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    hashes = ctx.hasher.hashes(ctx.tokens("s9", 2))
    d1.replies = [events_pb2.KvReplayReply(batches=[batch_of(d1.worker_id, 2, stored(hashes))], seq=3)]
    await d1.publish(3)  # seq 2 is "lost"
    from_seq = await ctx.until_replay(d1, 1)
    expect(from_seq == 2, f"replay asked from seq {from_seq}, the first missing one is 2")
    await asyncio.sleep(0.3)
    got = await ctx.cached(hashes, 2)
    expect(got == 2, f"blocks of the replayed batch 2 not applied: Route says {got} of 2 cached")


@clause(10, "a full-dump replay reply replaces what the scheduler knew of the worker")
async def full_dump(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    kept = ctx.hasher.hashes(ctx.tokens("s10", 1))
    before = ctx.hasher.hashes(ctx.tokens("s8", 4))[:3]
    d1.replies = [events_pb2.KvReplayReply(full_dump=True, held=kept, seq=20)]
    asked = len(d1.replay_requests)
    await d1.publish(20)
    await ctx.until_replay(d1, asked + 1)
    await asyncio.sleep(0.3)
    expect(await ctx.cached(kept, 1) == 1, "a block in the full dump is not counted as cached")
    expect(await ctx.cached(before, 0) == 0, "blocks missing from the full dump are still counted")


@clause(11, "a heartbeat whose kv_event_seq is ahead of the batches seen triggers a replay")
async def heartbeat_seq(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    asked = len(d1.replay_requests)
    d1.replies = [events_pb2.KvReplayReply(batches=[batch_of(d1.worker_id, 21), batch_of(d1.worker_id, 22)], seq=22)]
    d1.kv_event_seq = 22
    await d1.beat()
    from_seq = await ctx.until_replay(d1, asked + 1)
    expect(from_seq == 21, f"heartbeat says seq 22 after batch 20: replay should start at 21, asked {from_seq}")


@clause(12, "a heartbeat with a new started_at (a restart) drops what the worker announced before")
async def restart(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    kept = ctx.hasher.hashes(ctx.tokens("s10", 1))
    expect(await ctx.cached(kept, 1) == 1, "needs S10's state (1 cached block)")
    d1.started_at, d1.kv_event_seq = time.time() + 1, 0
    await d1.beat()
    await asyncio.sleep(0.3)
    got = await ctx.cached(kept, 0)
    expect(got == 0, f"after a restart the old blocks still count ({got} cached)")


@clause(13, "Complete: INVALID_ARGUMENT without request_id; unknown ids are accepted (idempotent)")
async def complete(ctx: Session) -> None:
    await expect_status(ctx.stub.Complete(scheduler_pb2.CompleteRequest(status="ok"), timeout=10), INVALID,
                        what="Complete without request_id")
    await ctx.stub.Complete(scheduler_pb2.CompleteRequest(request_id=f"conform-unknown-{uuid.uuid4().hex}", status="ok"),
                            timeout=10)


@clause(14, "SetProductionPool: a weight outside [0, 1] is INVALID_ARGUMENT; a switch answers the previous pool and moves traffic")
async def production_pool(ctx: Session) -> None:
    await ctx.worker("d1")
    bad = scheduler_pb2.SetProductionPoolRequest(pool="production", canary_pool=ctx.pool, canary_weight=1.5)
    await expect_status(ctx.stub.SetProductionPool(bad, timeout=10), INVALID, what="canary_weight 1.5")
    previous = (await ctx.stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=10)).production_pool
    reply = await ctx.stub.SetProductionPool(scheduler_pb2.SetProductionPoolRequest(pool=ctx.pool), timeout=10)
    try:
        expect(reply.previous_pool == previous, f"previous_pool {reply.previous_pool!r}, ListWorkers said {previous!r}")
        listed = await ctx.stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=10)
        expect(listed.production_pool == ctx.pool, f"ListWorkers says production is {listed.production_pool!r}")
        routed = await ctx.route(pool="")
        expect(routed.pool == ctx.pool, f"a Route without pool went to {routed.pool!r}, production is {ctx.pool!r}")
    finally:
        await ctx.stub.SetProductionPool(scheduler_pb2.SetProductionPoolRequest(pool=previous), timeout=10)


@clause(15, f"a worker whose heartbeats stop is dropped within {EXPIRY_S:g} s")
async def expiry(ctx: Session) -> None:
    d1 = await ctx.worker("d1")
    await d1.stop()
    deadline = time.monotonic() + EXPIRY_S
    while time.monotonic() < deadline and d1.worker_id in await ctx.listed():
        await asyncio.sleep(0.2)
    expect(d1.worker_id not in await ctx.listed(), f"{d1.worker_id} still listed {EXPIRY_S:g}s after its last heartbeat")
    await expect_status(ctx.route(), UNAVAILABLE, what="Route after the pool's only live worker expired")


@clause(16, f"a decode worker whose heartbeat live_requests no longer holds a routed request gets its load back within {RECONCILE_S:g} s")
async def reconcile(ctx: Session) -> None:
    d3 = await ctx.worker("d3", live=[])
    await asyncio.sleep(0.5)
    request_id = ""
    try:
        reply = await ctx.route(complete=False)
        request_id = ctx.last_request_id
        expect(reply.decode.worker_id == d3.worker_id, f"routed to {reply.decode.worker_id}, the only live worker is {d3.worker_id}")
        expect((await ctx.listed())[d3.worker_id].inflight >= 1, "a routed, uncompleted request is not counted as inflight")
        deadline = time.monotonic() + RECONCILE_S
        while time.monotonic() < deadline and (await ctx.listed())[d3.worker_id].inflight:
            await asyncio.sleep(0.2)
        expect(not (await ctx.listed())[d3.worker_id].inflight,
               f"inflight still counted {RECONCILE_S:g}s after heartbeats stopped listing the request")
    finally:
        if request_id:
            await ctx.stub.Complete(scheduler_pb2.CompleteRequest(request_id=request_id, status="error"), timeout=10)


from . import scheduleradmission  # noqa: E402, F401 - registers S17, S18 (admission) after S16
from . import schedulerstream  # noqa: E402, F401 - registers S19 (the Routes stream)
