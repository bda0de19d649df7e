"""Our decode worker passes `kvmesh conform decode` (one process, every clause D1..), with the
suite's recording KV store as its hand-back target."""

from __future__ import annotations

from kvmesh.conform.decode import REGISTRY
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite


async def test_decode_conforms(nats, tmp_path) -> None:
    port, store_port = free_port(), free_port()
    worker = Service("decode", ["--port", str(port), "--metrics-port", "-1", "--worker-id", "decode-conform",
                                "--torch-threads", "1", "--kvstore", f"127.0.0.1:{store_port}"],
                     {"KVMESH_NATS_URL": nats.url, "KVMESH_DECODE_PREFILL_TIMEOUT_S": "5"}, tmp_path / "decode.log")
    try:
        worker.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("decode", f"127.0.0.1:{port}", nats=nats.url, drain_pid=worker.pid,
                              kvstore_port=store_port)
        assert_conforms(results)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        worker.stop()
