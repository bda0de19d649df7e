"""Our kvstore passes `kvmesh conform kvstore` (one process, every clause K1..)."""

from __future__ import annotations

from kvmesh.conform.kvstore import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite


async def test_kvstore_conforms(nats, tmp_path) -> None:
    port = free_port()
    store = Service("kvstore", ["--port", str(port), "--metrics-port", "-1", "--store-id", "kvstore-conform"],
                    {"KVMESH_NATS_URL": nats.url}, tmp_path / "kvstore.log")
    try:
        store.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("kvstore", f"127.0.0.1:{port}", nats=nats.url, drain_pid=store.pid)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        store.stop()
