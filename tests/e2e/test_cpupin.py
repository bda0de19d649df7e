"""`kvmesh up --pin-engines` on a real mesh: the engine process runs on a CPU of its own, every
other process (nats-server too) on the rest, and the mesh serves as it does unpinned."""

from __future__ import annotations

import os

import psutil
import pytest

from kvmesh.runtime.process import parse_cpu_list

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                       reason="pinning needs Linux and two CPUs"),
]


def test_a_pinned_mesh_serves_with_its_engine_alone_on_its_cpu(start_mesh):
    mesh = start_mesh(prefill=0, decode=1, pin_engines=True)
    top = max(os.sched_getaffinity(0))
    reply = mesh.openai_client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "pinned"}], max_tokens=8)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1

    worker = psutil.Process(mesh.pid("decode-0"))
    [engine] = [c for c in worker.children(recursive=True) if any(a.endswith(".enginehost") for a in c.cmdline())]
    # NOTE: the engine gets its torch threads' worth of CPUs from the top: 1 of 2, 15 of 16
    own = parse_cpu_list(mesh.mesh.cpu_layout.engines[0])
    assert top in own
    assert set(engine.cpu_affinity()) == own
    assert all(t.id and set(os.sched_getaffinity(t.id)) == own for t in engine.threads())  # torch's threads too
    others = [psutil.Process(r.proc.pid) for r in mesh.mesh.procs]
    shared = {name: sorted(p.cpu_affinity()) for name, p in zip((r.spec.name for r in mesh.mesh.procs), others)}
    assert {"nats", "gateway", "scheduler", "kvstore", "decode-0"} <= set(shared)
    expected = sorted(parse_cpu_list(mesh.mesh.specs[0].env["KVMESH_CPUS"]))
    assert expected and not own & set(expected)
    assert shared == dict.fromkeys(shared, expected)
