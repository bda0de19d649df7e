"""Scheduler.Routes: Route and Complete multiplexed on one stream, against the real scheduler
in-process (real nats-server, real gRPC), driven by a raw client of the stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import grpc

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.grpcutil import BATCH_METADATA
from kvmesh.runtime.pb import scheduler_pb2
from kvmesh.runtime.telemetry import Telemetry

from .test_service import DEADLINE_S, _async, _has, eventually, heartbeats, route_request, scheduler

WORKERS = ("d0", "d1", "d2", "d3")


class RawStream:
    """A client of one Routes call: sends routes and completes, collects answers by request id."""

    def __init__(self, stub, packs: bool = False) -> None:  # noqa: ANN001
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._answers: dict[str, asyncio.Future] = {}
        self.frames: list[scheduler_pb2.RouteStreamResponse] = []  # as read, packed ones whole
        self.call = stub.Routes(self._requests(), metadata=(BATCH_METADATA,) if packs else ())
        self._reader = asyncio.create_task(self._read())

    def send(self, frame: scheduler_pb2.RouteStreamRequest) -> None:
        self._outbox.put_nowait(frame)

    def route(self, request: scheduler_pb2.RouteRequest, timeout_s: float = 0.0, trace_context=None) -> None:  # noqa: ANN001
        streamed = scheduler_pb2.StreamedRoute(request=request, timeout_s=timeout_s, trace_context=trace_context or {})
        self._outbox.put_nowait(scheduler_pb2.RouteStreamRequest(route=streamed))

    def complete(self, request_id: str, status: str = "ok") -> None:
        complete = scheduler_pb2.CompleteRequest(request_id=request_id, status=status)
        self._outbox.put_nowait(scheduler_pb2.RouteStreamRequest(complete=complete))

    def forget(self, request_id: str) -> None:
        """Its answer was taken; the id may be routed again."""
        del self._answers[request_id]

    def answer(self, request_id: str) -> asyncio.Future:
        return self._answers.setdefault(request_id, asyncio.get_running_loop().create_future())

    async def reply(self, request_id: str, timeout_s: float = DEADLINE_S) -> scheduler_pb2.RouteStreamResponse:
        return await asyncio.wait_for(asyncio.shield(self.answer(request_id)), timeout_s)

    async def close(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _requests(self):
        while True:
            yield await self._outbox.get()

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for frame in self.call:
                self.frames.append(frame)
                for out in frame.batch or (frame,):
                    future = self.answer(out.request_id)
                    assert not future.done(), f"{out.request_id} answered twice"
                    future.set_result(out)


def only(worker: str, request_id: str) -> scheduler_pb2.RouteRequest:
    """A route that only `worker` may take (every other one excluded)."""
    request = route_request(request_id)
    request.exclude_workers.extend(w for w in WORKERS if w != worker)
    return request


@contextlib.asynccontextmanager
async def mesh(nats_url: str, workers=WORKERS, max_num_seqs: int = 16, **overrides):
    bus = await Bus.connect(nats_url, "test")
    async with contextlib.AsyncExitStack() as stack:
        app, stub = await stack.enter_async_context(scheduler(nats_url, **overrides))
        for w in workers:
            await stack.enter_async_context(heartbeats(bus, w, max_num_seqs=max_num_seqs))
        await eventually(lambda: _has(stub, *workers))
        stream = RawStream(stub)
        stack.push_async_callback(stream.close)
        yield app, stub, stream
    await bus.close()


async def inflight(stub) -> dict[str, int]:  # noqa: ANN001
    reply = await stub.ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=DEADLINE_S)
    return {w.worker_id: w.inflight for w in reply.workers}


async def test_64_concurrent_routes_on_one_stream_each_get_their_own_answer(nats_server):
    async with mesh(nats_server.url) as (app, stub, stream):
        wanted = {f"r{i}": WORKERS[i % 4] for i in range(64)}
        for request_id, worker in wanted.items():
            stream.route(only(worker, request_id))
        replies = await asyncio.gather(*(stream.reply(rid) for rid in wanted))
        assert {r.request_id: r.route.decode.worker_id for r in replies} == wanted
        assert all(r.error_code == 0 for r in replies)
        assert await inflight(stub) == {w: 16 for w in WORKERS} and app.gate.queue.active == 64
        for request_id in wanted:
            stream.complete(request_id)
        await eventually(lambda: _async(app.gate.queue.active == 0 and app.router.registry.open_assignments() == 0))
        assert await inflight(stub) == {w: 0 for w in WORKERS}


async def test_a_route_waiting_for_admission_holds_up_no_other_route_on_the_stream(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=4.0) as (app, _stub, stream):
        stream.route(route_request("held"))
        assert (await stream.reply("held")).route.decode.worker_id == "d0"
        stream.route(route_request("waits"))
        await eventually(lambda: _async(app.gate.queue.depth == 1))
        bad = scheduler_pb2.RouteRequest(request_id="bad", num_prompt_tokens=0)
        empty_pool = route_request("elsewhere")
        empty_pool.pool = "nobody-here"
        stream.route(bad)
        stream.route(empty_pool)
        assert (await stream.reply("bad", timeout_s=1.0)).error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert (await stream.reply("elsewhere", timeout_s=1.0)).error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert not stream.answer("waits").done()
        stream.complete("held")
        waited = await stream.reply("waits")
        assert waited.route.decode.worker_id == "d0" and waited.route.queue_wait_s > 0.0


async def test_a_full_queue_answers_resource_exhausted_with_retry_after(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=1.0) as (_app, _stub, stream):
        stream.route(route_request("held"))
        await stream.reply("held")
        stream.route(route_request("queued"))
        stream.route(route_request("refused"))
        refused = await stream.reply("refused", timeout_s=1.0)
        assert refused.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "admission queue full" in refused.error_message and refused.retry_after_s >= 1.0
        assert not stream.answer("queued").done()


async def test_complete_on_the_stream_releases_load_and_admission_like_the_unary_complete(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=2, admission_queue_factor=1.0) as (app, stub, stream):
        stream.route(route_request("streamed"))
        await stream.reply("streamed")
        await stub.Route(route_request("unary"), timeout=DEADLINE_S)
        assert await inflight(stub) == {"d0": 2} and app.gate.queue.active == 2
        stream.route(route_request("queued"))
        await eventually(lambda: _async(app.gate.queue.depth == 1))
        stream.complete("streamed")
        assert (await stream.reply("queued")).route.decode.worker_id == "d0"  # the freed slot went to it
        assert app.router.registry.complete("streamed") is None  # already released
        for request_id in ("unary", "queued"):
            await stub.Complete(scheduler_pb2.CompleteRequest(request_id=request_id, status="ok"), timeout=DEADLINE_S)
        assert await inflight(stub) == {"d0": 0} and app.gate.queue.active == 0


async def test_a_complete_for_a_route_still_waiting_cancels_it_and_leaves_nothing_behind(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=1.0) as (app, _stub, stream):
        stream.route(route_request("held"))
        await stream.reply("held")
        stream.route(route_request("gave-up"))
        await eventually(lambda: _async(app.gate.queue.depth == 1))
        stream.complete("gave-up")
        await eventually(lambda: _async(app.gate.queue.depth == 0 and not app.gate._waiters))
        stream.complete("held")
        stream.route(route_request("next"))
        assert (await stream.reply("next")).route.decode.worker_id == "d0"
        assert not stream.answer("gave-up").done()  # a route its caller completed is not answered


async def test_a_route_whose_deadline_passes_while_queued_is_deadline_exceeded(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=1.0) as (app, _stub, stream):
        stream.route(route_request("held"))
        await stream.reply("held")
        stream.route(route_request("late"), timeout_s=0.3)
        late = await stream.reply("late")
        assert late.error_code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert app.gate.queue.depth == 0 and app.gate.queue.active == 1


async def test_when_the_stream_ends_waiting_routes_are_dropped_and_routed_ones_stay_assigned(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=1.0) as (app, stub, stream):
        stream.route(route_request("routed"))
        await stream.reply("routed")
        stream.route(route_request("waiting"))
        await eventually(lambda: _async(app.gate.queue.depth == 1))
        await stream.close()  # a gateway that died
        await eventually(lambda: _async(app.gate.queue.depth == 0 and not app.gate._waiters))
        # as with a dead gateway's unary Routes: the routed request holds its slot until its
        # Complete comes another way (or reconciliation / the slot timeout reclaims it)
        assert app.gate.queue.active == 1 and await inflight(stub) == {"d0": 1}
        await stub.Complete(scheduler_pb2.CompleteRequest(request_id="routed", status="error"), timeout=DEADLINE_S)
        assert app.gate.queue.active == 0 and await inflight(stub) == {"d0": 0}


async def test_each_route_is_its_own_trace_with_scheduler_route_parented_to_its_context(nats_server, tmp_path: Path):
    telemetry = Telemetry("scheduler-test", trace_dir=str(tmp_path))
    parents = {f"t{i}": (f"{i + 1:032x}", f"{i + 1:016x}") for i in range(3)}
    try:
        async with mesh(nats_server.url, workers=("d0",)) as (_app, _stub, stream):
            for request_id, (trace_id, span_id) in parents.items():
                stream.route(route_request(request_id), trace_context={"traceparent": f"00-{trace_id}-{span_id}-01"})
            for request_id in parents:
                await stream.reply(request_id)
                stream.complete(request_id)
        telemetry.flush()
    finally:
        telemetry.shutdown()
    spans = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    routes = {s["attributes"]["kvmesh.request_id"]: s for s in spans if s["name"] == "scheduler.route"}
    assert {rid: (s["trace_id"], s["parent_id"]) for rid, s in routes.items()} == parents
    assert not [s for s in spans if s["name"] != "scheduler.route"]  # no span of the stream parents them


async def test_a_client_that_half_closes_gets_its_answers_then_the_stream_ends_ok(nats_server):
    async with mesh(nats_server.url, workers=("d0",), max_num_seqs=1, admission_queue_factor=1.0) as (_app, stub, _stream):
        call = stub.Routes(timeout=DEADLINE_S)
        await call.write(scheduler_pb2.RouteStreamRequest(route=scheduler_pb2.StreamedRoute(request=route_request("r1"))))
        await call.done_writing()
        out = await call.read()
        assert (out.request_id, out.route.decode.worker_id) == ("r1", "d0")
        assert await call.read() is grpc.aio.EOF and await call.code() is grpc.StatusCode.OK


def packed(*frames: scheduler_pb2.RouteStreamRequest) -> scheduler_pb2.RouteStreamRequest:
    return scheduler_pb2.RouteStreamRequest(batch=scheduler_pb2.RouteStreamBatch(frames=frames))


def route_frame(request: scheduler_pb2.RouteRequest) -> scheduler_pb2.RouteStreamRequest:
    return scheduler_pb2.RouteStreamRequest(route=scheduler_pb2.StreamedRoute(request=request))


def complete_frame(request_id: str) -> scheduler_pb2.RouteStreamRequest:
    return scheduler_pb2.RouteStreamRequest(complete=scheduler_pb2.CompleteRequest(request_id=request_id, status="ok"))


async def test_packed_routes_and_completes_are_served_in_order_and_a_client_that_reads_packs_gets_answers_packed(nats_server):
    async with mesh(nats_server.url) as (app, stub, _):
        assert dict(await stub.Routes(iter(())).initial_metadata()).get(BATCH_METADATA[0]) == BATCH_METADATA[1]
        stream = RawStream(stub, packs=True)
        try:
            wanted = {f"p{i}": WORKERS[i % 4] for i in range(32)}
            stream.send(packed(*(route_frame(only(w, rid)) for rid, w in wanted.items())))
            replies = await asyncio.gather(*(stream.reply(rid) for rid in wanted))
            assert {r.request_id: r.route.decode.worker_id for r in replies} == wanted
            assert len(stream.frames) < 32 and any(len(f.batch) > 1 for f in stream.frames)
            # in order within one frame: p0's complete, then p0 routed again (the other way round,
            # the complete would cancel the new route, which would never be answered)
            stream.forget("p0")
            stream.send(packed(*(complete_frame(rid) for rid in wanted), route_frame(only("d3", "p0"))))
            assert (await stream.reply("p0")).route.decode.worker_id == "d3"
            stream.send(complete_frame("p0"))
            await eventually(lambda: _async(app.gate.queue.active == 0 and app.router.registry.open_assignments() == 0))
        finally:
            await stream.close()


async def test_a_client_that_does_not_read_packs_gets_every_answer_in_its_own_frame(nats_server):
    async with mesh(nats_server.url) as (_, _, stream):
        wanted = [f"s{i}" for i in range(32)]
        for rid in wanted:
            stream.route(only("d1", rid) if int(rid[1:]) < 16 else only("d2", rid))
        await asyncio.gather(*(stream.reply(rid) for rid in wanted))
        assert len(stream.frames) == 32 and not any(f.batch for f in stream.frames)


async def test_a_batch_inside_a_batch_ends_the_stream_invalid_argument(nats_server):
    async with mesh(nats_server.url) as (_, stub, _):
        call = stub.Routes(iter([packed(packed(route_frame(route_request("n0"))))]), metadata=(BATCH_METADATA,))
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT and "batch" in exc.details()
        else:
            raise AssertionError("the stream ended OK")
