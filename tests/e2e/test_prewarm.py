"""KV pre-warming end to end: a decode worker that joins a running mesh (kvmesh up's NATS users and
permissions, real KV store) is pre-warmed with the mesh's hot prefix and serves it from cache."""

from __future__ import annotations

import pytest

from kvmesh.runtime.launcher import ProcessSpec, free_port

from .polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

SYSTEM = [(7919 + i * 104729) % 200 + 32 for i in range(160)]  # 10 blocks of a shared system prompt


def ask(mesh, suffix: int) -> None:
    mesh.openai_client().completions.create(model="tiny", prompt=SYSTEM + [65 + suffix, 66, 67], max_tokens=2,
                                            temperature=0, extra_body={"ignore_eos": True})


def test_a_joining_decode_worker_is_prewarmed_with_the_hot_prefix(start_mesh):
    mesh = start_mesh(prefill=0, decode=1)
    for i in range(3):
        ask(mesh, i)
    assert eventually(lambda: mesh.metric("kvstore", "kvmesh_kvstore_blocks") >= 10, timeout_s=30)
    base = mesh.spec("decode-0")
    port, mport, host = free_port(), free_port(), mesh.mesh.opts.host
    store = mesh.spec("kvstore").grpc_endpoint
    args = ("--host", host, "--port", str(port), "--metrics-port", str(mport), "--worker-id", "decode-new",
            "--kvstore", store)
    mesh.mesh.add(ProcessSpec("decode-new", "decode", args, dict(base.env), grpc_endpoint=f"{host}:{port}",
                              metrics_target=f"{host}:{mport}"))
    assert eventually(lambda: mesh.metric("scheduler", "kvmesh_scheduler_prewarms_total", outcome="ok") == 1,
                      timeout_s=60), mesh.metrics_text("scheduler")
    assert mesh.metric("scheduler", "kvmesh_scheduler_prewarm_blocks_total") >= 10
    assert mesh.metric("decode-new", "kvmesh_decode_prewarm_blocks_total") >= 10
    assert mesh.metric("scheduler", "kvmesh_scheduler_prewarm_seconds_count") == 1
