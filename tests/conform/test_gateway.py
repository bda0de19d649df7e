"""Our gateway passes `kvmesh conform gateway` against the suite's fake scheduler and decode
workers; a gateway that never migrates fails G10."""

from __future__ import annotations

from kvmesh.conform.gateway import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, assert_fails_only, suite


def start_gateway(nats_url: str, log, **env: str) -> tuple[Service, str, int]:  # noqa: ANN001
    port, scheduler_port = free_port(), free_port()
    gateway = Service("gateway", ["--port", str(port), "--scheduler", f"127.0.0.1:{scheduler_port}"],
                      {"KVMESH_NATS_URL": nats_url, **env}, log)
    return gateway, f"http://127.0.0.1:{port}", scheduler_port


async def test_gateway_without_migration_fails_g10(nats, tmp_path) -> None:  # noqa: ANN001
    gateway, url, scheduler_port = start_gateway(nats.url, tmp_path / "gw.log", KVMESH_GATEWAY_MAX_MIGRATIONS="0")
    try:
        results = await suite("gateway", url, scheduler_port=scheduler_port, only=("G1", "G2", "G3", "G10"))
        assert_fails_only(results, "G10")
    finally:
        gateway.stop()


async def test_gateway_conforms(nats, tmp_path) -> None:  # noqa: ANN001
    gateway, url, scheduler_port = start_gateway(nats.url, tmp_path / "gateway.log", KVMESH_GATEWAY_MIRROR_SAMPLE="1")
    try:
        results = await suite("gateway", url, nats=nats.url, scheduler_port=scheduler_port)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        gateway.stop()
