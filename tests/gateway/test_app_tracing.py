"""One trace per request: the client's traceparent is the parent, and it reaches every hop."""

from __future__ import annotations

import json
from pathlib import Path

from kvmesh.runtime.telemetry import Telemetry

from .conftest import run_gateway
from .fakes import FakeMesh

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_traceparent_flows_to_scheduler_and_decode(mesh: FakeMesh, tmp_path: Path) -> None:
    telemetry = Telemetry("gateway-test", trace_dir=str(tmp_path))
    try:
        async with run_gateway(mesh) as gw, gw.client() as client:
            headers = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "X-Request-Id": "t-1", "X-Session-Id": "s-1"}
            resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, headers=headers)
            assert resp.status_code == 200
        telemetry.flush()
    finally:
        telemetry.shutdown()
    metadata = mesh.scheduler.metadata[0]
    assert metadata["traceparent"].split("-")[1] == TRACE_ID and metadata["x-request-id"].startswith("cmpl-")  # the gateway's own id, not the client's
    generate = mesh.decodes[0].requests[0]  # on the shared token stream the context travels per request
    assert generate.trace_context["traceparent"].split("-")[1] == TRACE_ID and generate.request_id == metadata["x-request-id"]
    spans = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    (span,) = [s for s in spans if s["name"] == "gateway.request"]
    assert span["trace_id"] == TRACE_ID and span["parent_id"] == "00f067aa0ba902b7"
    attrs = span["attributes"]
    assert attrs["kvmesh.request_id"] == resp.json()["id"] and attrs["kvmesh.client_request_id"] == "t-1"
    assert attrs["kvmesh.session_id"] == "s-1"
    assert attrs["gen_ai.request.model"] == "tiny" and attrs["http.route"] == "/v1/completions"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (3, 2)
