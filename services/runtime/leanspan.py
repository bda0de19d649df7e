"""Spans without the SDK Span's per-call bookkeeping, for the spans every request makes.

The OpenTelemetry SDK's `Span` cleans and bounds every attribute as it is set (type checks, a
lock, a BoundedAttributes per span) and costs ~43 µs of the event loop for a gateway request's
span (12 attributes, an event, two context injections; README, "The token path"). `LeanTracer`
makes the same decisions the SDK's tracer does (the provider's sampler, id generator, resource
and span processors, parent from the context) and hands each recording span to the processors as
an SDK `ReadableSpan` when it ends, so the exporters (JSONL, OTLP) see what they saw before. A
`LeanSpan` keeps its attributes in a dict: None values set later are dropped and lists become
tuples, as the SDK does; values are not otherwise checked, and there are no attribute, event or link limits
(our spans set a dozen). Spans the sampler drops are the API's `NonRecordingSpan`, as before.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)


def _clean(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class LeanSpan(trace.Span):
    """A recording span; see the module docstring. Not thread-safe (a span belongs to one task)."""

    __slots__ = ("_name", "_context", "_parent", "_kind", "_attributes", "_events", "_links", "_status", "_start",
                 "_end", "_tracer")

    def __init__(self, tracer: LeanTracer, name: str, span_context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: Mapping[str, Any] | None, links: Sequence[Link], start_time: int) -> None:
        self._tracer = tracer
        self._name = name
        self._context = span_context
        self._parent = parent
        self._kind = kind
        self._attributes = {k: _clean(v) for k, v in attributes.items()} if attributes else {}  # NOTE: the SDK keeps a None here
        self._events: list[Event] = []
        self._links = tuple(links)
        self._status = _UNSET
        self._start = start_time
        self._end: int | None = None

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end is None and value is not None:
            self._attributes[key] = _clean(value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end is None:
            for key, value in attributes.items():
                if value is not None:
                    self._attributes[key] = _clean(value)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None) -> None:
        if self._end is None:
            clean = {k: _clean(v) for k, v in attributes.items() if v is not None} if attributes else None
            self._events.append(Event(name, clean, timestamp or time.time_ns()))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self._end is None and context.is_valid:
            self._links += (Link(context, attributes),)

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end is not None or self._status.status_code is StatusCode.OK:
            return  # NOTE: as the SDK: an OK status is final
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        stacktrace = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        recorded = {"exception.type": type(exception).__qualname__, "exception.message": str(exception),
                    "exception.stacktrace": stacktrace, "exception.escaped": str(escaped), **(attributes or {})}
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end is not None:
            return
        self._end = end_time or time.time_ns()
        tracer = self._tracer
        tracer.processor.on_end(ReadableSpan(
            name=self._name, context=self._context, parent=self._parent, resource=tracer.resource,
            attributes=self._attributes, events=tuple(self._events), links=self._links, kind=self._kind,
            status=self._status, start_time=self._start, end_time=self._end, instrumentation_scope=tracer.scope,
        ))


class LeanTracer(trace.Tracer):
    """The SDK tracer's decisions (see the module docstring), making `LeanSpan`s."""

    def __init__(self, provider: TracerProvider, name: str) -> None:
        sdk = provider.get_tracer(name)
        self.sampler = sdk.sampler
        self.ids = sdk.id_generator
        self.resource = sdk.resource
        self.processor = sdk.span_processor
        self.scope = sdk._instrumentation_scope  # noqa: SLF001 - what the SDK's spans carry

    def start_span(self, name: str, context: context_api.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = (),
                   start_time: int | None = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace.Span:
        links = links or ()
        parent = trace.get_current_span(context).get_span_context()
        if parent is not None and not parent.is_valid:
            parent = None
        trace_id = parent.trace_id if parent is not None else self.ids.generate_trace_id()
        sampling = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
        flags = _SAMPLED if sampling.decision.is_sampled() else _UNSAMPLED
        if parent.trace_flags.random_trace_id if parent is not None else self.ids.is_trace_id_random():
            flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID)
        span_context = SpanContext(trace_id, self.ids.generate_span_id(), is_remote=False, trace_flags=flags,
                                   trace_state=sampling.trace_state)
        if not sampling.decision.is_recording():
            return trace.NonRecordingSpan(span_context)
        span = LeanSpan(self, name, span_context, parent, kind, sampling.attributes, links, start_time or time.time_ns())
        self.processor.on_start(span, parent_context=context)
        return span

    @contextlib.contextmanager
    def start_as_current_span(self, name: str, context: context_api.Context | None = None,
                              kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None,
                              links: Sequence[Link] | None = (), start_time: int | None = None,
                              record_exception: bool = True, set_status_on_exception: bool = True,
                              end_on_exit: bool = True) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                            set_status_on_exception=set_status_on_exception) as current:
            yield current
