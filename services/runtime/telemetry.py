"""Tracing: one tracer provider per process, W3C trace context across HTTP, gRPC and NATS.

Spans go to OTLP when `KVMESH_OTLP_ENDPOINT` is set, else to JSONL files under `trace_dir`
(one file per process) that `kvmesh trace` reads.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

tracer = trace.get_tracer("kvmesh")


class JsonlSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(span_to_dict(s), separators=(",", ":")) for s in spans]
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (span.attributes or {}).items()},
    }


class Telemetry:
    """The process's tracer provider; `shutdown()` flushes it."""

    def __init__(self, service: str, otlp_endpoint: str = "", trace_dir: str = ".kvmesh/traces") -> None:
        resource = Resource.create({"service.name": service, "service.instance.id": f"{service}-{os.getpid()}"})
        self.provider = TracerProvider(resource=resource)
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

            exporter: SpanExporter = OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True)
        else:
            exporter = JsonlSpanExporter(Path(trace_dir) / f"{service}-{os.getpid()}.jsonl")
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        trace.set_tracer_provider(self.provider)

    def shutdown(self) -> None:
        self.provider.force_flush(5_000)
        self.provider.shutdown()


def inject_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def extract_context(pairs: Any) -> context.Context:
    """A context from gRPC invocation metadata or a NATS/HTTP header mapping."""
    if pairs is None:
        return context.get_current()
    carrier = dict(pairs.items()) if hasattr(pairs, "items") else {k: v for k, v in pairs}
    return propagate.extract(carrier)


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    """Makes the caller's trace context current inside every handler."""

    async def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        ctx = extract_context(handler_call_details.invocation_metadata or ())

        def attach(behavior: Callable, streaming: bool) -> Callable:
            if streaming:
                async def stream(request: Any, servicer_context: Any) -> Any:
                    token = context.attach(ctx)
                    try:
                        async for item in behavior(request, servicer_context):
                            yield item
                    finally:
                        context.detach(token)

                return stream

            async def unary(request: Any, servicer_context: Any) -> Any:
                token = context.attach(ctx)
                try:
                    return await behavior(request, servicer_context)
                finally:
                    context.detach(token)

            return unary

        for kind, factory in (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        ):
            behavior = getattr(handler, kind)
            if behavior:
                streaming = kind.endswith("_stream")
                return factory(attach(behavior, streaming), handler.request_deserializer, handler.response_serializer)
        return handler
