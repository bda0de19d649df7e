"""One request, one trace: spans of every process, correctly parented, drawn by `kvmesh trace`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmesh.runtime.tracecli import find_traces, load_spans

pytestmark = pytest.mark.e2e


def test_a_streaming_chat_request_is_one_trace_across_the_mesh(mesh):
    request_id = f"trace-e2e-{time.monotonic_ns()}"
    client = mesh.openai_client()
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "trace me " * 20}], max_tokens=6, stream=True,
        extra_headers={"X-Request-Id": request_id})
    chunks = list(stream)
    mesh_id = chunks[0].id  # the gateway's own id keys the mesh; the client's is kept for correlation
    trace_dir = Path(mesh.mesh.run_dir) / "traces"

    def trace_spans() -> list:
        traces = find_traces(load_spans(trace_dir)[0], request_id)
        return traces[0] if traces else []

    def orphans(spans) -> list[str]:
        ids = {s.span_id for s in spans}
        return [f"{s.service}:{s.name}" for s in spans if s.parent_id and s.parent_id not in ids]

    def complete(spans) -> bool:
        return wanted <= {s.service for s in spans} and not orphans(spans)

    # Each process exports its spans on its own schedule, and a parent ends (and is exported) after
    # its children, so the trace is read until it is whole or the deadline passes.
    wanted = {"gateway", "scheduler", "prefill", "decode", "kvstore"}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not complete(trace_spans()):
        time.sleep(0.3)  # span processors flush every 0.5 s
    [spans] = find_traces(load_spans(trace_dir)[0], request_id)
    assert wanted <= {s.service for s in spans}
    assert len({s.trace_id for s in spans}) == 1
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_id is None]
    assert [(r.service, r.name) for r in roots] == [("gateway", "gateway.request")]
    assert not orphans(spans), f"these spans' parents never reached the trace: {orphans(spans)}"
    names = {s.name for s in spans}
    assert {"scheduler.route", "prefill.compute", "kv.push", "decode.generate"} <= names

    def ancestors(span):
        while span.parent_id:
            span = by_id[span.parent_id]
            yield span

    push = next(s for s in spans if s.name == "kv.push")
    assert any(a.name == "gateway.request" for a in ancestors(push))
    drawn = subprocess.run([sys.executable, "-m", "kvmesh", "trace", "--dir", str(trace_dir), request_id],
                           capture_output=True, text=True, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    for name in ("gateway.request", "scheduler.route", "prefill.compute", "kv.push", "decode.generate"):
        assert name in drawn.stdout
    listed = subprocess.run([sys.executable, "-m", "kvmesh", "trace", "--dir", str(trace_dir)],
                            capture_output=True, text=True, timeout=60)
    assert mesh_id in listed.stdout
