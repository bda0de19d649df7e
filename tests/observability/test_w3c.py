"""runtime/w3c.py: the same contexts and headers as OpenTelemetry's global propagator, whatever comes."""

from __future__ import annotations

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvmesh.runtime import w3c

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CARRIERS = [
    {},
    {"x-request-id": "abc"},
    {"traceparent": TP},
    {"traceparent": TP.replace("-01", "-00")},
    {"traceparent": TP, "x-request-id": "abc", "user-agent": "grpc-python"},
    {"traceparent": TP.upper()},
    {"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"},
    {"traceparent": "ff" + TP[2:]},
    {"traceparent": "01" + TP[2:] + "-extra"},
    {"traceparent": TP + "-extra"},
    {"traceparent": " " + TP},
    {"traceparent": ""},
    {"traceparent": "garbage"},
    {"traceparent": TP, "tracestate": "vendor=value,other=1"},
    {"traceparent": TP, "baggage": "user=alice,tier=gold"},
    {"baggage": "user=alice"},
]


def _state(ctx: context.Context) -> tuple:
    span_context = trace.get_current_span(ctx).get_span_context()
    return (span_context.trace_id, span_context.span_id, span_context.is_remote, int(span_context.trace_flags),
            span_context.trace_state.to_header(), dict(baggage.get_all(ctx)))


@pytest.mark.parametrize("carrier", CARRIERS)
def test_extract_gives_what_the_sdks_propagator_gives(carrier) -> None:
    assert _state(w3c.extract(carrier)) == _state(propagate.extract(carrier))


def test_inject_gives_what_the_sdks_propagator_gives() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    def sdk(ctx=None) -> dict:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, ctx)
        return carrier

    assert w3c.inject() == sdk() == {}
    for provider in (TracerProvider(), TracerProvider(sampler=ALWAYS_OFF)):
        with provider.get_tracer("t").start_as_current_span("s"):
            assert w3c.inject() == sdk() and "traceparent" in w3c.inject()
    remote = w3c.extract({"traceparent": TP, "tracestate": "vendor=value"})
    assert w3c.inject(remote) == sdk(remote) == {"traceparent": TP, "tracestate": "vendor=value"}
    with_baggage = baggage.set_baggage("user", "alice", remote)
    assert w3c.inject(with_baggage) == sdk(with_baggage) and "baggage" in sdk(with_baggage)


def test_another_global_propagator_is_used_as_it_is() -> None:
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator()]))  # no baggage
    try:
        carrier = {"traceparent": TP, "baggage": "user=alice"}
        assert _state(w3c.extract(carrier)) == _state(propagate.extract(carrier))
        assert dict(baggage.get_all(w3c.extract(carrier))) == {}
        ctx = baggage.set_baggage("user", "alice", w3c.extract({"traceparent": TP}))
        assert w3c.inject(ctx) == {"traceparent": TP}
    finally:
        propagate.set_global_textmap(previous)
