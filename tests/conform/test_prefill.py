"""Our prefill worker passes `kvmesh conform prefill` (one process, every clause P1..)."""

from __future__ import annotations

from kvmesh.conform.prefill import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite


async def test_prefill_conforms(nats, tmp_path) -> None:
    port = free_port()
    worker = Service("prefill", ["--port", str(port), "--metrics-port", "-1", "--worker-id", "prefill-conform",
                                 "--torch-threads", "1"],
                     {"KVMESH_NATS_URL": nats.url, "KVMESH_PREFILL_PUSH_TIMEOUT_S": "5"}, tmp_path / "prefill.log")
    try:
        worker.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("prefill", f"127.0.0.1:{port}", nats=nats.url, drain_pid=worker.pid)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        worker.stop()
