"""LeanTracer records what the SDK's tracer records: the same exported fields for the same calls,
exceptions and statuses as the SDK sets them, attributes cleaned as the SDK cleans them."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode

from kvmesh.runtime.leanspan import LeanSpan, LeanTracer
from kvmesh.runtime.telemetry import span_to_dict


def _pair(sampler=None):  # noqa: ANN001, ANN202
    out = []
    for lean in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(**({"sampler": sampler} if sampler is not None else {}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        out.append((LeanTracer(provider, "kvmesh") if lean else provider.get_tracer("kvmesh"), exporter))
    return out


def _work(tracer) -> None:  # noqa: ANN001
    with tracer.start_as_current_span("outer", kind=SpanKind.SERVER, attributes={"a": 1, "gone": None}) as outer:
        outer.set_attributes({"b": "x", "c": [1, 2]})
        outer.add_event("routed", {"n": 3})
        inner = tracer.start_span("inner", attributes={"request_id": "r"})
        inner.set_attribute("tokens", 8)
        inner.set_status(Status(StatusCode.ERROR, "bad"))
        inner.end()
        inner.set_attribute("after_end", 1)  # ignored, as by the SDK
    with pytest.raises(ValueError), tracer.start_as_current_span("failing"):
        raise ValueError("boom")
    ok = tracer.start_span("ok")
    ok.set_status(Status(StatusCode.OK))
    ok.set_status(Status(StatusCode.ERROR, "later"))  # an OK status is final
    ok.end()


def _comparable(span) -> dict:  # noqa: ANN001
    record = span_to_dict(span)
    for key in ("trace_id", "span_id", "parent_id", "start_ns", "end_ns"):
        record[key] = record[key] is not None
    for event in record.get("events", []):
        event["time_ns"] = event["time_ns"] > 0
        event["attributes"].pop("exception.stacktrace", None)
    return record


def test_lean_spans_export_what_sdk_spans_export():
    (sdk, sdk_out), (lean, lean_out) = _pair()
    _work(sdk)
    _work(lean)
    assert [_comparable(s) for s in lean_out.get_finished_spans()] == [_comparable(s) for s in sdk_out.get_finished_spans()]
    spans = {s.name: s for s in lean_out.get_finished_spans()}
    assert spans["inner"].parent.span_id == spans["outer"].context.span_id
    assert spans["inner"].context.trace_id == spans["outer"].context.trace_id
    assert dict(spans["outer"].attributes) == {"a": 1, "gone": None, "b": "x", "c": (1, 2)}  # as the SDK keeps them
    assert spans["failing"].status.status_code is StatusCode.ERROR and spans["failing"].events[0].name == "exception"
    assert spans["ok"].status.status_code is StatusCode.OK


def test_the_sampler_decides_as_for_sdk_spans():
    (_, _), (lean, out) = _pair(ParentBased(ALWAYS_OFF))
    root = lean.start_span("root")
    assert not isinstance(root, LeanSpan) and not root.get_span_context().trace_flags.sampled
    sampled_parent = trace.NonRecordingSpan(trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(1)))
    child = lean.start_span("child", context=trace.set_span_in_context(sampled_parent))
    assert isinstance(child, LeanSpan) and child.get_span_context().trace_id == 1
    root.end()
    child.end()
    assert [s.name for s in out.get_finished_spans()] == ["child"]
