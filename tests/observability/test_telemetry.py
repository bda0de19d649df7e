"""Telemetry: one provider per process writing JSONL, trace context across gRPC with server spans."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace

from kvmesh.runtime.errors import Unavailable
from kvmesh.runtime.grpcutil import check_health, start_server
from kvmesh.runtime.telemetry import (
    Telemetry,
    TracingServerInterceptor,
    extract_context,
    inject_metadata,
    tracer,
)
from kvmesh.runtime.tracecli import build_rows, load_spans


def read_spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_spans_go_to_one_jsonl_file_per_process_with_service_name(tmp_path: Path) -> None:
    telemetry = Telemetry("gateway", trace_dir=str(tmp_path))
    with tracer.start_as_current_span("outer", attributes={"kvmesh.request_id": "r1"}):
        with tracer.start_as_current_span("inner"):
            pass
    telemetry.shutdown()
    assert telemetry.trace_file is not None and telemetry.trace_file.parent == tmp_path
    assert telemetry.trace_file.name.startswith("gateway-")
    inner, outer = read_spans(telemetry.trace_file)
    assert (inner["name"], outer["name"]) == ("inner", "outer")
    assert inner["service"] == outer["service"] == "gateway"
    assert inner["trace_id"] == outer["trace_id"] and inner["parent_id"] == outer["span_id"]
    assert outer["parent_id"] is None and outer["attributes"] == {"kvmesh.request_id": "r1"}


def test_services_started_one_after_another_each_get_their_provider(tmp_path: Path) -> None:
    files = []
    for service in ("scheduler", "decode"):
        telemetry = Telemetry(service, trace_dir=str(tmp_path / service))
        with tracer.start_as_current_span(f"{service}.work"):
            pass
        with trace.get_tracer("other.library").start_as_current_span(f"{service}.lib"):
            pass
        telemetry.shutdown()
        files.append(telemetry.trace_file)
    with tracer.start_as_current_span("after shutdown"):
        pass
    assert [[s["name"] for s in read_spans(f)] for f in files] == [
        ["scheduler.work", "scheduler.lib"],
        ["decode.work", "decode.lib"],
    ]


def test_context_round_trips_through_metadata_and_headers(tmp_path: Path) -> None:
    telemetry = Telemetry("gateway", trace_dir=str(tmp_path))
    with tracer.start_as_current_span("client") as span:
        metadata = inject_metadata()
        want = span.get_span_context()
    telemetry.shutdown()
    assert dict(metadata)["traceparent"].split("-")[1] == f"{want.trace_id:032x}"
    for carrier in (metadata, dict(metadata), {"Traceparent": dict(metadata)["traceparent"]}):
        got = trace.get_current_span(extract_context(carrier)).get_span_context()
        assert (got.trace_id, got.span_id) == (want.trace_id, want.span_id)


def test_the_standard_sampler_variables_sample_whole_traces(tmp_path: Path, monkeypatch) -> None:
    """OTEL_TRACES_SAMPLER / _ARG (README, "What tracing costs"): the root decides, every hop follows it."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    gateway = Telemetry("gateway", trace_dir=str(tmp_path / "gateway"))
    with tracer.start_as_current_span("gateway.request") as root:
        dropped = inject_metadata()
        assert not root.is_recording()
    with tracer.start_as_current_span("client.sampled", context=extract_context(
            {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})):
        kept = inject_metadata()  # NOTE: a caller's sampled trace is kept whatever the ratio
    gateway.shutdown()
    sampled = [int(dict(m)["traceparent"].rsplit("-", 1)[1], 16) & 1 for m in (dropped, kept)]  # W3C trace-flags bit 0
    assert sampled == [0, 1]

    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")  # NOTE: a downstream ratio never overrides its parent's choice
    decode = Telemetry("decode", trace_dir=str(tmp_path / "decode"))
    for carrier in (dropped, kept):
        tracer.start_span("decode.generate", context=extract_context(carrier)).end()
    decode.shutdown()
    assert [s["name"] for s in read_spans(gateway.trace_file)] == ["client.sampled"]
    assert [s["trace_id"] for s in read_spans(decode.trace_file)] == ["0af7651916cd43dd8448eb211c80319c"]


def _register_echo(behavior):
    def add(_servicer, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(behavior)
        stream = grpc.unary_stream_rpc_method_handler(_stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Say": handler, "Stream": stream}),))

    return add


async def _stream(request: bytes, _context):
    for i in range(3):
        with tracer.start_as_current_span("handler.chunk"):
            yield request + bytes([i])


async def _say(request: bytes, _context) -> bytes:
    with tracer.start_as_current_span("handler.work"):
        if request == b"fail":
            raise Unavailable("backend down")
        if request == b"bad":
            raise ValueError("bad input")
        return request


@pytest.fixture
async def echo_server():
    server = await start_server("127.0.0.1", 0, [(_register_echo(_say), None, "test.Echo")], [TracingServerInterceptor()])
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield server, channel
    await channel.close()
    await server.stop(0)


async def test_server_span_joins_the_callers_trace(tmp_path: Path, echo_server) -> None:
    server, channel = echo_server
    telemetry = Telemetry("gateway", trace_dir=str(tmp_path))
    say = channel.unary_unary("/test.Echo/Say")
    stream = channel.unary_stream("/test.Echo/Stream")
    with tracer.start_as_current_span("client", attributes={"kvmesh.request_id": "r1"}):
        assert await say(b"hi", metadata=inject_metadata(), timeout=5) == b"hi"
        assert [c async for c in stream(b"x", metadata=inject_metadata(), timeout=5)] == [b"x\0", b"x\1", b"x\2"]
    assert await check_health(f"127.0.0.1:{server.port}")
    assert await say(b"untraced", timeout=5) == b"untraced"  # no caller context: no server span
    telemetry.shutdown()
    spans, _ = load_spans(tmp_path)
    rows = [(r.depth, r.span.name, r.span.kind) for r in build_rows(spans)]
    assert rows == [
        (0, "client", "INTERNAL"),
        (1, "test.Echo/Say", "SERVER"),
        (2, "handler.work", "INTERNAL"),
        (1, "test.Echo/Stream", "SERVER"),
        (2, "handler.chunk", "INTERNAL"),
        (2, "handler.chunk", "INTERNAL"),
        (2, "handler.chunk", "INTERNAL"),
        (0, "handler.work", "INTERNAL"),
    ]
    say_span = next(s for s in spans if s.name == "test.Echo/Say")
    assert say_span.attributes == {"rpc.system": "grpc", "rpc.service": "test.Echo", "rpc.method": "Say",
                                   "rpc.grpc.status_code": 0}


async def test_server_span_status_follows_the_grpc_code(tmp_path: Path, echo_server) -> None:
    _server, channel = echo_server
    telemetry = Telemetry("gateway", trace_dir=str(tmp_path))
    say = channel.unary_unary("/test.Echo/Say")
    for payload, code in ((b"fail", grpc.StatusCode.UNAVAILABLE), (b"bad", grpc.StatusCode.INVALID_ARGUMENT)):
        with tracer.start_as_current_span("client"):
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await say(payload, metadata=inject_metadata(), timeout=5)
        assert failure.value.code() == code
    # NOTE: an aborting handler sends its status before its span ends (that takes the server's next
    # turn of the event loop): the client can hear the second error first
    deadline = time.monotonic() + 5
    while len([s for s in load_spans(tmp_path)[0] if s.kind == "SERVER"]) < 2 and time.monotonic() < deadline:
        telemetry.provider.force_flush(1_000)
        await asyncio.sleep(0.01)
    telemetry.shutdown()
    spans, _ = load_spans(tmp_path)
    servers = [s for s in spans if s.kind == "SERVER"]
    assert [(s.attributes["rpc.grpc.status_code"], s.status) for s in servers] == [(14, "ERROR"), (3, "UNSET")]


def test_spans_go_to_the_otlp_endpoint_when_one_is_set(tmp_path: Path) -> None:
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        telemetry = Telemetry("decode", otlp_endpoint=f"http://127.0.0.1:{port}", trace_dir=str(tmp_path))
        assert telemetry.trace_file is None
        with tracer.start_as_current_span("decode.generate"):
            pass
        telemetry.shutdown()
    finally:
        server.stop(0)
    [request] = received
    [resource_spans] = request.resource_spans
    attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert attributes["service.name"] == "decode"
    assert [s.name for s in resource_spans.scope_spans[0].spans] == ["decode.generate"]
    assert list(tmp_path.iterdir()) == []
