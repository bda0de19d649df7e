"""Our scheduler passes `kvmesh conform scheduler` (one process, every clause S1..)."""

from __future__ import annotations

from kvmesh.conform.scheduler import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite


async def test_scheduler_conforms(nats, tmp_path) -> None:
    port = free_port()
    scheduler = Service("scheduler", ["--port", str(port), "--metrics-port", str(free_port())],
                        {"KVMESH_NATS_URL": nats.url, "KVMESH_SCHEDULER_HEARTBEAT_TIMEOUT_S": "1.5",
                         "KVMESH_SCHEDULER_REPLAY_TIMEOUT_S": "0.5"}, tmp_path / "scheduler.log")
    try:
        scheduler.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("scheduler", f"127.0.0.1:{port}", nats=nats.url)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        scheduler.stop()
