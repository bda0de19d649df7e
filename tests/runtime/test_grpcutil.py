import asyncio

import grpc
import pytest

from kvmesh.runtime import grpcutil
from kvmesh.runtime.errors import InvalidArgument, ResourceExhausted
from kvmesh.runtime.grpcutil import ChannelPool, check_health, start_server
from kvmesh.runtime.pb import decode_pb2, decode_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


class Failing(scheduler_pb2_grpc.SchedulerServicer):
    async def Route(self, request, context):
        if request.request_id == "bad":
            raise InvalidArgument("num_prompt_tokens must be > 0")
        if request.request_id == "full":
            raise ResourceExhausted("queue full", retry_after_s=2.5)
        if request.request_id == "value":
            raise ValueError("plain ValueError")
        raise RuntimeError("boom")


class Streaming(decode_pb2_grpc.DecodeWorkerServicer):
    async def Generate(self, request, context):
        yield decode_pb2.GenerateResponse(token_ids=[1])
        raise InvalidArgument("stop after one")

    async def Stream(self, request_iterator, context):
        async for _ in request_iterator:  # a malformed first frame raises here
            yield decode_pb2.StepOutput()


@pytest.fixture
async def server():
    started = await start_server("127.0.0.1", 0, [
        (scheduler_pb2_grpc.add_SchedulerServicer_to_server, Failing(), "kvmesh.v1.Scheduler"),
        (decode_pb2_grpc.add_DecodeWorkerServicer_to_server, Streaming(), "kvmesh.v1.DecodeWorker"),
    ])
    pool = ChannelPool()
    yield started, pool.get(f"127.0.0.1:{started.port}")
    await pool.close()
    await started.stop(0)


@pytest.mark.parametrize("request_id, code, message", [
    ("bad", grpc.StatusCode.INVALID_ARGUMENT, "num_prompt_tokens must be > 0"),
    ("value", grpc.StatusCode.INVALID_ARGUMENT, "plain ValueError"),
    ("full", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"),
    ("other", grpc.StatusCode.INTERNAL, "internal error: RuntimeError"),
])
async def test_exceptions_map_to_status_codes(server, request_id, code, message):
    _, channel = server
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await scheduler_pb2_grpc.SchedulerStub(channel).Route(scheduler_pb2.RouteRequest(request_id=request_id), timeout=5)
    assert info.value.code() == code
    assert info.value.details() == message


async def test_a_method_the_servicer_does_not_implement_is_unimplemented_not_internal(server):
    _, channel = server  # Failing implements Route only: the generated Complete raises NotImplementedError
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await scheduler_pb2_grpc.SchedulerStub(channel).Complete(scheduler_pb2.CompleteRequest(request_id="r"), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_resource_exhausted_carries_retry_after(server):
    _, channel = server
    call = scheduler_pb2_grpc.SchedulerStub(channel).Route(scheduler_pb2.RouteRequest(request_id="full"), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert dict(info.value.trailing_metadata())["retry-after"] == "2.5"


async def test_stream_errors_after_items_keep_the_items(server):
    _, channel = server
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for reply in decode_pb2_grpc.DecodeWorkerStub(channel).Generate(decode_pb2.GenerateRequest(), timeout=5):
            got.append(list(reply.token_ids))
    assert got == [[1]] and info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_service_answers(server):
    started, _ = server
    assert await check_health(f"127.0.0.1:{started.port}")
    assert await check_health(f"127.0.0.1:{started.port}", service="kvmesh.v1.Scheduler")
    await started.set_serving(False)
    assert not await check_health(f"127.0.0.1:{started.port}")


@pytest.mark.parametrize("payload", [b"\xff\xff\xff\xff", b"\x0a\x05ab", bytes(range(256))])
async def test_unparseable_request_bytes_are_invalid_argument(server, payload):
    _, channel = server
    raw = channel.unary_unary("/kvmesh.v1.Scheduler/Route", request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw(payload, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request message" in info.value.details()


def test_advertised_endpoint():
    import socket

    from kvmesh.runtime.grpcutil import advertised_endpoint

    assert advertised_endpoint("127.0.0.1", "", 5) == "127.0.0.1:5"
    assert advertised_endpoint("0.0.0.0", "decode-3", 5) == "decode-3:5"
    assert advertised_endpoint("0.0.0.0", "", 5) == f"{socket.gethostbyname(socket.gethostname())}:5"


async def test_a_taken_port_is_refused_not_shared(server):
    started, _ = server
    with pytest.raises(OSError, match=f"cannot bind gRPC server to 127.0.0.1:{started.port}"):
        await start_server("127.0.0.1", started.port, [
            (scheduler_pb2_grpc.add_SchedulerServicer_to_server, Failing(), "kvmesh.v1.Scheduler"),
        ])


async def test_a_bidi_call_failing_while_the_client_still_sends_gets_its_status_not_internal(server):
    """Issue 16 item 1(a): a malformed frame ends the call while more frames are on the way;
    gRPC core used to reset the stream and the client saw INTERNAL ("Internal error from Core")."""
    _, channel = server
    raw = channel.stream_stream("/kvmesh.v1.DecodeWorker/Stream", request_serializer=None, response_deserializer=None)
    codes = []
    for _ in range(20):
        call = raw(iter([b"\x1d\xa8"] + [b"\x0a\x00" * 4096] * 64), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        codes.append(info.value.code())
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}


async def test_an_unimplemented_stream_answers_while_the_client_still_holds_its_stream_open(server, monkeypatch):
    """A peer that keeps its request stream open (the gateway's Routes stream) against a servicer
    without the method gets its status at once, not after the failed-call drain (made 10 minutes
    here, so a drained call would hit the test's 5 s deadline)."""
    monkeypatch.setattr(grpcutil, "DRAIN_S", 600.0)
    monkeypatch.setattr(grpcutil._drain, "__defaults__", (600.0,))
    _, channel = server  # Failing implements Route only: the generated Routes raises NotImplementedError
    held = asyncio.Event()

    async def open_stream():
        yield scheduler_pb2.StreamedRoute(request=scheduler_pb2.RouteRequest(request_id="r"))
        await held.wait()  # never set: the stream stays open until the call ends

    call = scheduler_pb2_grpc.SchedulerStub(channel).Routes(open_stream(), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL)  # INTERNAL: grpc/grpc#36066


class Framed(decode_pb2_grpc.DecodeWorkerServicer):
    """Answers with bytes it serialized itself, and reads PushKv's requests as bytes."""

    RAW_REQUESTS = ("PushKv",)

    def __init__(self) -> None:
        self.pushed: list = []

    async def Generate(self, request, context):
        yield decode_pb2.GenerateResponse(token_ids=[7, 8]).SerializeToString()
        yield decode_pb2.GenerateResponse(token_ids=[9])  # a message still works beside bytes

    async def PushKv(self, request_iterator, context):
        async for frame in request_iterator:
            self.pushed.append(frame)
        return decode_pb2.PushKvResponse(blocks_received=len(self.pushed))


async def test_bytes_answers_pass_through_and_raw_requests_arrive_as_bytes():
    framed = Framed()
    started = await start_server("127.0.0.1", 0, [(decode_pb2_grpc.add_DecodeWorkerServicer_to_server, framed,
                                                    "kvmesh.v1.DecodeWorker")])
    pool = ChannelPool()
    try:
        stub = decode_pb2_grpc.DecodeWorkerStub(pool.get(f"127.0.0.1:{started.port}"))
        got = [list(r.token_ids) async for r in stub.Generate(decode_pb2.GenerateRequest(), timeout=5)]
        assert got == [[7, 8], [9]]
        sent = [decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=n)) for n in (1, 2)]
        reply = await stub.PushKv(iter(sent), timeout=5)
        assert reply.blocks_received == 2
        assert framed.pushed == [m.SerializeToString() for m in sent]  # unparsed
    finally:
        await pool.close()
        await started.stop(0)
