"""The independent decode worker in examples/hf_decode (HF transformers, non-paged cache) passes
`kvmesh conform decode`, skipping only what it documents it does not do."""

from __future__ import annotations

import sys
from pathlib import Path

from kvmesh.conform.decode import REGISTRY
from kvmesh.engine.tiny import ensure_tiny_model
from kvmesh.runtime.launcher import free_port

from .conftest import Service, assert_conforms, suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_decode"
NO_CACHE = {"D12", "D15", "D16", "D17", "D22"}   # no hand-back, no prefix cache (no KV events), no pushed KV


def example_worker(port: int, nats_url: str, log: Path, worker_id: str = "hf-decode-conform") -> Service:
    argv = [sys.executable, str(EXAMPLE / "worker.py"), "--model-dir", str(ensure_tiny_model()), "--model-name", "tiny",
            "--port", str(port), "--nats", nats_url, "--worker-id", worker_id, "--torch-threads", "1"]
    return Service("hf_decode", [], {}, log, argv=argv)


def test_example_imports_only_the_stubs() -> None:
    for path in EXAMPLE.glob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import kvmesh", "from kvmesh")):
                assert line.startswith("from kvmesh.runtime.pb import"), f"{path.name}: {line}"


async def test_example_decode_conforms(nats, tmp_path) -> None:  # noqa: ANN001
    port = free_port()
    worker = example_worker(port, nats.url, tmp_path / "hf_decode.log")
    try:
        worker.wait_grpc(f"127.0.0.1:{port}")
        results = await suite("decode", f"127.0.0.1:{port}", nats=nats.url, drain_pid=worker.pid,
                              kvstore_port=free_port())
        assert_conforms(results, skipped=NO_CACHE)
        assert len(results) == len(REGISTRY.clauses)
    finally:
        worker.stop()
