"""Our canary passes `kvmesh conform canary` against the suite's fake scheduler and candidate worker."""

from __future__ import annotations

from kvmesh.conform.canary import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite


async def test_canary_conforms(nats, tmp_path) -> None:
    port, scheduler_port = free_port(), free_port()
    canary = Service("canary", ["--port", str(port), "--http-port", str(free_port()), "--scheduler",
                                f"127.0.0.1:{scheduler_port}"],
                     {"KVMESH_NATS_URL": nats.url, "KVMESH_CANARY_NOISE_SAMPLE": "0", "KVMESH_CANARY_WARMUP_REPLAYS": "2"},
                     tmp_path / "canary.log")
    try:
        canary.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("canary", f"127.0.0.1:{port}", nats=nats.url, scheduler_port=scheduler_port)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        canary.stop()
