"""The gateway's Routes streams against real schedulers in-process (real nats-server, real gRPC):
routes and completes on one stream per replica, failover when a stream breaks, reopening, the
unary fallback, and one trace per request."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import grpc
import pytest

from kvmesh.gateway.backend import Backend
from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.routestream import RouteStream
from kvmesh.gateway.wire import retry_after_from
from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.grpcutil import start_server
from kvmesh.runtime.launcher import free_port
from kvmesh.runtime.pb import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from kvmesh.runtime.telemetry import Telemetry, inject_metadata, tracer
from kvmesh.scheduler import metrics as scheduler_metrics

from ..conftest import NatsServer
from ..scheduler.test_service import _async, _has, eventually, heartbeats, route_request, scheduler
from .fakes import FakeScheduler, start_fake_mesh

HASHER = BlockHasher("tiny", "float32", 16)


@contextlib.asynccontextmanager
async def replica(nats_url: str, worker: str, max_num_seqs: int = 8, **overrides):
    """One scheduler with one decode worker of its own heartbeating on `nats_url`."""
    bus = await Bus.connect(nats_url, "test")
    try:
        async with scheduler(nats_url, **overrides) as (app, stub), heartbeats(bus, worker, max_num_seqs=max_num_seqs):
            await eventually(lambda: _has(stub, worker))
            await eventually(lambda: _async(app.gate.queue.slots == max_num_seqs))
            yield app, stub, f"127.0.0.1:{app.port}"
    finally:
        await bus.close()


@contextlib.asynccontextmanager
async def gateway_backend(*endpoints: str, **overrides):
    backend = Backend(GatewaySettings(scheduler=",".join(endpoints), nats_url="", **overrides), HASHER)
    try:
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def second_nats():
    server = NatsServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def route(backend: Backend, request_id: str, timeout: float = 5.0) -> tuple[scheduler_pb2.RouteResponse, list[str]]:
    tried: list[str] = []
    metadata = (*inject_metadata(), ("x-request-id", request_id))
    return await backend.route(route_request(request_id), timeout, metadata, tried), tried


async def test_routes_and_completes_go_on_one_stream_per_replica(nats_server):
    async with replica(nats_server.url, "d0", max_num_seqs=32) as (app, _stub, endpoint), gateway_backend(endpoint) as backend:
        replies = await asyncio.gather(*(route(backend, f"r{i}") for i in range(32)))
        assert {(r.decode.worker_id, tuple(tried)) for r, tried in replies} == {("d0", (endpoint,))}
        stream = backend.route_streams.open(endpoint)
        assert stream is not None and app.gate.queue.active == 32
        for i in range(32):
            await backend.complete(endpoint, f"r{i}", "ok")
        await eventually(lambda: _async(app.gate.queue.active == 0 and app.router.registry.open_assignments() == 0))
        assert backend.route_streams.open(endpoint) is stream  # one stream carried all of it


def frames_read(kind: str) -> float:
    return scheduler_metrics.ROUTE_STREAM_FRAMES.labels(kind)._value.get()


async def test_a_burst_of_routes_and_completes_goes_packed_to_a_scheduler_that_reads_packs(nats_server):
    async with replica(nats_server.url, "d0", max_num_seqs=64) as (app, _stub, endpoint), gateway_backend(endpoint) as backend:
        await route(backend, "first")  # its answer brings the scheduler's initial metadata
        assert backend.route_streams.open(endpoint).packs
        before = {kind: frames_read(kind) for kind in ("route", "complete", "batch")}
        replies = await asyncio.gather(*(route(backend, f"r{i}") for i in range(48)))
        assert {r.decode.worker_id for r, _ in replies} == {"d0"}
        for request_id in ["first", *(f"r{i}" for i in range(48))]:
            await backend.complete(endpoint, request_id, "ok")
        await eventually(lambda: _async(app.gate.queue.active == 0 and app.router.registry.open_assignments() == 0))
        read = {kind: frames_read(kind) - n for kind, n in before.items()}
        assert read["batch"] >= 1 and read["route"] + read["complete"] + read["batch"] < 2 * 49


class NoPacks(scheduler_pb2_grpc.SchedulerServicer):
    """A Routes stream that answers each route at once and never says it reads packed frames."""

    def __init__(self) -> None:
        self.frames: list[scheduler_pb2.RouteStreamRequest] = []

    async def Routes(self, request_iterator, context):  # noqa: ANN001, N802
        async for frame in request_iterator:
            self.frames.append(frame)
            if frame.WhichOneof("msg") == "route":
                decode = common_pb2.WorkerRef(worker_id="w", endpoint="127.0.0.1:1")
                yield scheduler_pb2.RouteStreamResponse(request_id=frame.route.request.request_id,
                                                        route=scheduler_pb2.RouteResponse(decode=decode))


async def test_a_scheduler_that_does_not_read_packs_gets_every_frame_alone():
    fake = NoPacks()
    server = await start_server("127.0.0.1", 0, [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, fake, "kvmesh.v1.Scheduler")])
    endpoint = f"127.0.0.1:{server.port}"
    try:
        async with gateway_backend(endpoint) as backend:
            await asyncio.gather(*(route(backend, f"r{i}") for i in range(32)))
            for i in range(32):
                await backend.complete(endpoint, f"r{i}", "ok")
            await eventually(lambda: _async(len(fake.frames) == 64))
            assert not backend.route_streams.open(endpoint).packs
        assert all(f.WhichOneof("msg") in ("route", "complete") for f in fake.frames)
    finally:
        await server.stop(0)


async def test_a_stream_that_breaks_mid_flight_fails_its_routes_over_to_the_next_replica(nats_server):
    async with second_nats() as other, replica(nats_server.url, "da", max_num_seqs=1) as (a, stub_a, endpoint_a):
        async with replica(other.url, "db") as (_b, _stub_b, endpoint_b), gateway_backend(endpoint_a, endpoint_b) as backend:
            await stub_a.Route(route_request("holds-a"), timeout=5)  # a's only slot: the next route waits there
            waiting = asyncio.ensure_future(route(backend, "r1"))
            await eventually(lambda: _async(a.gate.queue.depth == 1))
            await a.stop(grace_s=0)  # a dies with r1 in flight on its stream
            reply, tried = await waiting
            assert (reply.decode.worker_id, tried) == ("db", [endpoint_a, endpoint_b])
            assert backend.schedulers.order()[-1] == endpoint_a  # marked failed: asked last for a while


async def test_a_broken_stream_is_reopened_for_the_next_request(nats_server):
    port = free_port()
    async with gateway_backend(f"127.0.0.1:{port}") as backend:
        async with replica(nats_server.url, "d0", port=port) as (_app, _stub, endpoint):
            await route(backend, "before")
            first = backend.route_streams.open(endpoint)
        async with replica(nats_server.url, "d0", port=port) as (app, _stub, endpoint):  # the replica restarted
            await eventually(lambda: _async(first.closed))
            assert backend.route_streams.open(endpoint) is None
            reply, _ = await route(backend, "after")
            assert reply.decode.worker_id == "d0" and backend.route_streams.open(endpoint) not in (None, first)
            await backend.complete(endpoint, "after", "ok")
            await eventually(lambda: _async(app.gate.queue.active == 0))


async def test_all_replicas_full_is_resource_exhausted_with_retry_after_and_marks_none_failed(nats_server):
    full = dict(max_num_seqs=1, admission_queue_factor=0.0)
    async with second_nats() as other, replica(nats_server.url, "da", **full) as (_a, stub_a, endpoint_a):
        async with replica(other.url, "db", **full) as (_b, stub_b, endpoint_b), gateway_backend(endpoint_a, endpoint_b) as backend:
            for stub in (stub_a, stub_b):
                await stub.Route(route_request("holder"), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await route(backend, "r1")
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert retry_after_from(refused.value.trailing_metadata()) >= 1.0
            assert backend.schedulers._down_until == {}


async def test_a_route_past_its_deadline_ends_on_the_gateway_and_its_complete_frees_the_queue(nats_server):
    async with replica(nats_server.url, "d0", max_num_seqs=1) as (app, stub, endpoint), gateway_backend(endpoint) as backend:
        await stub.Route(route_request("holder"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await route(backend, "late", timeout=0.3)
        assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        await backend.complete(endpoint, "late", "error")  # what a Generation does after a timed-out route
        await eventually(lambda: _async(app.gate.queue.depth == 0 and not app.gate._waiters))


async def test_a_scheduler_without_the_stream_is_asked_unary_for_route_and_complete():
    mesh = await start_fake_mesh(num_decode=1)  # FakeScheduler implements Route and Complete only
    try:
        async with gateway_backend(mesh.scheduler_endpoint) as backend:
            reply, tried = await route(backend, "r1")
            assert reply.decode.worker_id == "decode-0" and tried == [mesh.scheduler_endpoint]
            assert not backend.route_streams.supported(mesh.scheduler_endpoint)
            assert backend.route_streams.open(mesh.scheduler_endpoint) is None
            await backend.complete(mesh.scheduler_endpoint, "r1", "ok")
            assert [c.request_id for c in mesh.scheduler.completes] == ["r1"]
            assert mesh.scheduler.metadata[0]["x-request-id"] == "r1"
    finally:
        await mesh.stop()


class CoreErrorCall:
    """A Routes call that ends as grpc-python sometimes ends one to a peer without the method."""

    def __init__(self, details: str) -> None:
        self.details = details

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), self.details)

    def cancel(self) -> None:
        pass


class CoreErrorStub:
    def __init__(self, details: str) -> None:
        self.details = details

    def Routes(self, frames, metadata=()):  # noqa: ANN001, ANN201, ARG002, N802 - the stub's method name
        return CoreErrorCall(self.details)


@pytest.mark.parametrize(("details", "code"), [("Internal error from Core", grpc.StatusCode.UNIMPLEMENTED),
                                               ("the peer's own internal error", grpc.StatusCode.UNAVAILABLE)])
async def test_the_cores_internal_error_before_any_answer_reads_as_a_peer_without_the_stream(details, code):
    stream = RouteStream("127.0.0.1:1", CoreErrorStub(details))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stream.route(route_request("r1"), {}, timeout=5.0)
    assert raised.value.code() is code
    await stream.close()


class UnaryOnly(FakeScheduler):
    def __init__(self) -> None:
        super().__init__()
        self.streams = 0

    async def Routes(self, request_iterator, context):  # noqa: ANN001, N802
        self.streams += 1
        raise RuntimeError("the gateway was told not to use the stream")
        yield  # pragma: no cover - a generator, as the stream handler must be


async def test_with_the_stream_off_every_route_is_unary():
    fake = UnaryOnly()
    fake.workers.append(common_pb2.WorkerRef(worker_id="w", endpoint="127.0.0.1:1"))
    server = await start_server("127.0.0.1", 0, [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, fake, "kvmesh.v1.Scheduler")])
    try:
        async with gateway_backend(f"127.0.0.1:{server.port}", route_stream=False) as backend:
            assert backend.route_streams is None
            reply, _ = await route(backend, "r1")
            await backend.complete(f"127.0.0.1:{server.port}", "r1", "ok")
        assert (reply.decode.worker_id, len(fake.routes), len(fake.completes), fake.streams) == ("w", 1, 1, 0)
    finally:
        await server.stop(0)


async def test_each_request_is_one_trace_and_scheduler_route_is_a_child_of_its_context(nats_server, tmp_path: Path):
    telemetry = Telemetry("routestream-test", trace_dir=str(tmp_path))
    parents: dict[str, tuple[str, str]] = {}
    try:
        async with replica(nats_server.url, "d0") as (_app, _stub, endpoint), gateway_backend(endpoint) as backend:
            for i in range(3):
                with tracer.start_as_current_span("gateway.request") as span:  # as the gateway opens one per request
                    ctx = span.get_span_context()
                    parents[f"t{i}"] = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
                    await route(backend, f"t{i}")
                    await backend.complete(endpoint, f"t{i}", "ok")
        telemetry.flush()
    finally:
        telemetry.shutdown()
    spans = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    routes = {s["attributes"]["kvmesh.request_id"]: s for s in spans if s["name"] == "scheduler.route"}
    assert {rid: (s["trace_id"], s["parent_id"]) for rid, s in routes.items()} == parents
    assert sorted(s["name"] for s in spans) == ["gateway.request"] * 3 + ["scheduler.route"] * 3
