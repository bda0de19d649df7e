"""The scheduler service in-process: a real nats-server, a real gRPC server on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from prometheus_client import REGISTRY

from kvmesh.runtime.bus import HEARTBEAT_SUBJECT, Bus
from kvmesh.runtime.kvevents import KvEventPublisher, stored
from kvmesh.runtime.pb import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from kvmesh.scheduler.config import SchedulerSettings
from kvmesh.scheduler.main import SchedulerApp

from .helpers import hashes

DEADLINE_S = 5.0
P = hashes("prompt", 6)


@contextlib.asynccontextmanager
async def scheduler(nats_url: str, **overrides):
    overrides.setdefault("sync_alone_s", 0.0)  # NOTE: these tests add their workers after the start
    overrides.setdefault("port", 0)
    settings = SchedulerSettings(
        nats_url=nats_url, host="127.0.0.1", metrics_port=0, heartbeat_timeout_s=1.0, **overrides
    )
    app = await SchedulerApp.start(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield app, scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        await channel.close()
        await app.stop(grace_s=0.1)


@contextlib.asynccontextmanager
async def heartbeats(bus: Bus, worker_id: str, max_num_seqs: int = 8, role=common_pb2.WORKER_ROLE_DECODE, max_model_len: int = 0,
                     seq=lambda: 0, interval_s: float = 0.1):
    """Publishes a worker's heartbeat (`kv_event_seq` = `seq()`) every `interval_s` while the block runs."""
    beat = events_pb2.Heartbeat(
        worker_id=worker_id, role=role, endpoint=f"127.0.0.1:1{len(worker_id)}00{worker_id[-1]}", pool="production",
        block_size=16, max_num_seqs=max_num_seqs, started_at=1.0, max_model_len=max_model_len,
    )
    subject = HEARTBEAT_SUBJECT.format(role="decode", worker_id=worker_id)

    async def run() -> None:
        while True:
            beat.kv_event_seq = seq()
            await bus.publish(subject, beat)
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def worker_ids(stub) -> list[str]:
    reply = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
    return [w.worker_id for w in reply.workers]


def route_request(request_id: str, blocks=P) -> scheduler_pb2.RouteRequest:
    return scheduler_pb2.RouteRequest(request_id=request_id, num_prompt_tokens=16 * len(blocks) + 4, block_hashes=list(blocks))


async def test_heartbeats_register_a_worker_that_routes_then_disappears(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    async with scheduler(nats_server.url) as (_app, stub):
        async with heartbeats(bus, "d1"):
            await eventually(lambda: _has(stub, "d1"), timeout_s=2.0)
            reply = await stub.Route(route_request("r1"), timeout=DEADLINE_S)
            assert (reply.decode.worker_id, reply.local_prefill, reply.policy) == ("d1", True, "kv_aware")
            await stub.Complete(scheduler_pb2.CompleteRequest(request_id="r1", status="ok"), timeout=DEADLINE_S)
        await eventually(lambda: _gone(stub, "d1"), timeout_s=5.0)
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await stub.Route(route_request("r2"), timeout=DEADLINE_S)
        assert unavailable.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "no decode worker" in unavailable.value.details()
    await bus.close()


async def test_list_workers_carries_each_workers_reported_max_model_len(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    async with scheduler(nats_server.url) as (_app, stub):
        async with heartbeats(bus, "d1", max_model_len=6144), heartbeats(bus, "d2"):
            await eventually(lambda: _has(stub, "d1", "d2"), timeout_s=2.0)
            reply = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
            assert {w.worker_id: w.max_model_len for w in reply.workers} == {"d1": 6144, "d2": 0}
    await bus.close()


async def test_bad_input_is_invalid_argument(nats_server):
    async with scheduler(nats_server.url) as (_app, stub):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.Route(scheduler_pb2.RouteRequest(request_id="r1", num_prompt_tokens=0), timeout=DEADLINE_S)
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_kv_events_route_to_the_warm_worker_and_gaps_are_replayed(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    async with scheduler(nats_server.url, policy="kv_aware") as (app, stub):
        async with heartbeats(bus, "d1"), heartbeats(bus, "d2"):
            await eventually(lambda: _has(stub, "d1", "d2"))
            held = set()
            publisher = await KvEventPublisher.start(bus, "d2", lambda: sorted(held))
            held.update(P[:2])
            await publisher.publish([stored(P[:2])])
            held.update(P[2:4])
            publisher.log.append([stored(P[2:4])])  # seq 2 is "lost" on the way
            held.update(P[4:])
            await publisher.publish([stored(P[4:], parent_hash=P[3])])  # seq 3 reveals the gap
            await eventually(lambda: _async(app.router.index.overlap(["d2"], P)["d2"] == 6))
            assert app.router.index.stats.gaps == 1
            reply = await stub.Route(route_request("r1"), timeout=DEADLINE_S)
            assert (reply.decode.worker_id, reply.decode_cached_blocks, reply.policy) == ("d2", 6, "kv_aware")
            assert REGISTRY.get_sample_value("kvmesh_scheduler_route_decisions_total", {"policy": "kv_aware", "prefill": "local"}) >= 1
            await eventually(lambda: _async((REGISTRY.get_sample_value("kvmesh_scheduler_kv_event_gaps_total") or 0) >= 1))
            assert REGISTRY.get_sample_value("kvmesh_scheduler_kv_events_applied_total") >= 3
            assert REGISTRY.get_sample_value("kvmesh_scheduler_workers", {"role": "decode", "pool": "production"}) == 2
            await publisher.close()
    await bus.close()


async def test_a_full_queue_answers_resource_exhausted_with_retry_after(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    async with scheduler(nats_server.url, admission_queue_factor=1.0) as (_app, stub):
        async with heartbeats(bus, "d1", max_num_seqs=1):
            await eventually(lambda: _has(stub, "d1"))
            await stub.Route(route_request("r1"), timeout=DEADLINE_S)  # takes the only slot
            queued = asyncio.ensure_future(stub.Route(route_request("r2"), timeout=DEADLINE_S))
            await asyncio.sleep(0.2)
            assert not queued.done()
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await stub.Route(route_request("r3"), timeout=DEADLINE_S)
            assert full.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(full.value.trailing_metadata() or ())
            assert float(trailers["retry-after"]) >= 1.0
            await stub.Complete(scheduler_pb2.CompleteRequest(request_id="r1", status="ok"), timeout=DEADLINE_S)
            reply = await queued
            assert reply.decode.worker_id == "d1" and reply.queue_wait_s > 0.0
    await bus.close()


async def test_set_production_pool_returns_the_previous_pool(nats_server):
    async with scheduler(nats_server.url) as (_app, stub):
        reply = await stub.SetProductionPool(scheduler_pb2.SetProductionPoolRequest(pool="canary"), timeout=DEADLINE_S)
        assert reply.previous_pool == "production"
        listed = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
        assert listed.production_pool == "canary"


async def test_set_production_pool_takes_a_canary_share_and_refuses_bad_ones(nats_server):
    async with scheduler(nats_server.url) as (_app, stub):
        request = scheduler_pb2.SetProductionPoolRequest(pool="production", canary_pool="candidate", canary_weight=0.25)
        await stub.SetProductionPool(request, timeout=DEADLINE_S)
        listed = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
        assert (listed.production_pool, listed.canary_pool, listed.canary_weight) == ("production", "candidate", 0.25)
        for bad in (
            scheduler_pb2.SetProductionPoolRequest(pool=""),
            scheduler_pb2.SetProductionPoolRequest(pool="production", canary_pool="candidate", canary_weight=2.0),
            scheduler_pb2.SetProductionPoolRequest(pool="production", canary_weight=0.5),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetProductionPool(bad, timeout=DEADLINE_S)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        listed = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
        assert listed.canary_weight == 0.25


async def _has(stub, *ids: str) -> bool:
    return set(ids) <= set(await worker_ids(stub))


async def _gone(stub, worker_id: str) -> bool:
    return worker_id not in await worker_ids(stub)


async def _async(value: bool) -> bool:
    return value

