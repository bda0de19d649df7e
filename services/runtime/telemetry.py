"""Tracing: one tracer provider per process, W3C trace context across HTTP, gRPC and NATS.

Spans go to OTLP when `KVMESH_OTLP_ENDPOINT` is set, else to JSONL files under `trace_dir`
(one file per process) that `kvmesh trace` reads (see `tracecli.py`).

Every module traces through the module-level `tracer`; it follows the newest live `Telemetry`
of the process, so services started one after another in one test process each get their
own provider, and spans made with no `Telemetry` alive cost nothing.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import orjson
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import w3c
from .leanspan import LeanTracer

# Attribute that ties spans to the gateway's request id; `kvmesh trace` lists requests by it.
REQUEST_ID_ATTRIBUTE = "kvmesh.request_id"
CLIENT_REQUEST_ID_ATTRIBUTE = "kvmesh.client_request_id"  # the caller's X-Request-Id: correlation only

# gRPC codes that mark a server span as failed (OpenTelemetry semantic conventions); the rest
# (NOT_FOUND, INVALID_ARGUMENT, ...) are the caller's business.
_SERVER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_UNTRACED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class _ActiveTracer(trace.Tracer):
    """Delegates to the tracer of the newest live `Telemetry`, or to a no-op tracer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stack: list[tuple[TracerProvider, trace.Tracer]] = []
        self._noop = trace.NoOpTracer()

    def _real(self) -> trace.Tracer:
        stack = self._stack
        return stack[-1][1] if stack else self._noop

    def push(self, provider: TracerProvider) -> None:
        with self._lock:
            self._stack.append((provider, LeanTracer(provider, "kvmesh")))

    def remove(self, provider: TracerProvider) -> None:
        with self._lock:
            self._stack = [entry for entry in self._stack if entry[0] is not provider]

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._real().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._real().start_as_current_span(*args, **kwargs)


class _ActiveTracerProvider(trace.TracerProvider):
    """Installed as the global provider so `trace.get_tracer(...)` anywhere also follows `tracer`."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return tracer


tracer = _ActiveTracer()


class JsonlSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("ab")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # NOTE: orjson: ~0.5 µs a span where json.dumps took ~10 (this runs in every traced process).
        data = b"".join(orjson.dumps(span_to_dict(s), default=str, option=orjson.OPT_APPEND_NEWLINE) for s in spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(data)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def _plain(attributes: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in (attributes or {}).items()}


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """The JSONL record of one span (the format `tracecli` reads)."""
    ctx = span.get_span_context()
    record: dict[str, Any] = {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": _plain(span.attributes),
    }
    if span.status.description:
        record["status_message"] = span.status.description
    if span.events:
        record["events"] = [{"name": e.name, "time_ns": e.timestamp, "attributes": _plain(e.attributes)} for e in span.events]
    return record


def _exporter(service: str, otlp_endpoint: str, trace_dir: str) -> SpanExporter:
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

        return OTLPSpanExporter(endpoint=otlp_endpoint, insecure=not otlp_endpoint.startswith("https://"))
    # NOTE: the host name keeps replicas apart when containers (all pid 1) share a trace volume.
    return JsonlSpanExporter(Path(trace_dir) / f"{service}-{socket.gethostname()}-{os.getpid()}.jsonl")


class Telemetry:
    """The process's tracer provider: OTLP when `otlp_endpoint` is set, else a JSONL file under
    `trace_dir`. `shutdown()` flushes and detaches it."""

    def __init__(self, service: str, otlp_endpoint: str = "", trace_dir: str = ".kvmesh/traces") -> None:
        self.service = service
        resource = Resource.create(
            {
                "service.name": service,
                "service.namespace": "kvmesh",
                "service.instance.id": f"{service}-{socket.gethostname()}-{os.getpid()}",
            }
        )
        self.exporter = _exporter(service, otlp_endpoint, trace_dir)
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter, schedule_delay_millis=500))
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(_ActiveTracerProvider())
        tracer.push(self.provider)

    @property
    def trace_file(self) -> Path | None:
        """The JSONL file spans go to, or None with OTLP."""
        return self.exporter.path if isinstance(self.exporter, JsonlSpanExporter) else None

    def flush(self, timeout_ms: int = 5_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        tracer.remove(self.provider)
        self.provider.force_flush(5_000)
        self.provider.shutdown()


def inject_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata."""
    return tuple(w3c.inject().items())


def extract_context(pairs: Any) -> context.Context:
    """A context from gRPC invocation metadata or a NATS/HTTP header mapping."""
    if pairs is None:
        return context.get_current()
    items = pairs.items() if hasattr(pairs, "items") else pairs
    carrier = {k.lower(): v for k, v in items if isinstance(v, str)}
    return w3c.extract(carrier)


def _finish_server_span(span: trace.Span, servicer_context: Any, error: BaseException | None) -> None:
    code_of = getattr(servicer_context, "code", None)
    code = code_of() if callable(code_of) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN if error is not None else grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_ERROR_CODES:
        details_of = getattr(servicer_context, "details", None)
        details = details_of() if callable(details_of) else None
        span.set_status(Status(StatusCode.ERROR, details or code.name))


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    """Makes the caller's trace context current inside every handler and, when the caller sent
    one, records a SERVER span per RPC (`kvmesh.v1.DecodeWorker/Generate`) around it."""

    async def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method or ""
        ctx = extract_context(handler_call_details.invocation_metadata or ())
        traced = trace.get_current_span(ctx).get_span_context().is_valid and not method.startswith(_UNTRACED_SERVICES)
        service, _, rpc = method.lstrip("/").partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc}

        def open_span() -> Any:
            return tracer.start_as_current_span(
                method.lstrip("/"),
                context=ctx,
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )

        def wrap_stream(behavior: Callable) -> Callable:
            async def stream(request: Any, servicer_context: Any) -> Any:
                if not traced:
                    token = context.attach(ctx)
                    try:
                        async for item in behavior(request, servicer_context):
                            yield item
                    finally:
                        context.detach(token)
                    return
                with open_span() as span:
                    error: BaseException | None = None
                    try:
                        async for item in behavior(request, servicer_context):
                            yield item
                    except BaseException as exc:
                        error = exc
                        raise
                    finally:
                        _finish_server_span(span, servicer_context, error)

            return stream

        def wrap_unary(behavior: Callable) -> Callable:
            async def unary(request: Any, servicer_context: Any) -> Any:
                if not traced:
                    token = context.attach(ctx)
                    try:
                        return await behavior(request, servicer_context)
                    finally:
                        context.detach(token)
                with open_span() as span:
                    error: BaseException | None = None
                    try:
                        return await behavior(request, servicer_context)
                    except BaseException as exc:
                        error = exc
                        raise
                    finally:
                        _finish_server_span(span, servicer_context, error)

            return unary

        for kind, factory in (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        ):
            behavior = getattr(handler, kind)
            if behavior:
                wrapped = wrap_stream(behavior) if kind.endswith("_stream") else wrap_unary(behavior)
                return factory(wrapped, handler.request_deserializer, handler.response_serializer)
        return handler
