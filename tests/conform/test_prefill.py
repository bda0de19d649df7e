"""Our prefill worker passes `kvmesh conform prefill` (one process, every clause P1..); a proxy
that misreports the push fails the intended clause."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvmesh.conform.prefill import REGISTRY
from kvmesh.runtime.launcher import free_port

from .breaker import changed
from .conftest import Service, assert_conforms, assert_fails_only, broken_suite, suite


@pytest.fixture(scope="module")
def worker(nats, tmp_path_factory) -> Iterator[tuple[Service, str]]:  # noqa: ANN001
    port = free_port()
    service = Service("prefill", ["--port", str(port), "--metrics-port", "-1", "--worker-id", "prefill-conform",
                                  "--torch-threads", "1"],
                      {"KVMESH_NATS_URL": nats.url, "KVMESH_PREFILL_PUSH_TIMEOUT_S": "5"},
                      tmp_path_factory.mktemp("prefill") / "prefill.log")
    service.wait_grpc(f"127.0.0.1:{port}")
    yield service, f"127.0.0.1:{port}"
    service.stop()


async def test_broken_prefill_fails_p2(worker) -> None:  # noqa: ANN001
    breaker = {"replies": {"PrefillWorker/Prefill": lambda r: changed(r, blocks_pushed=r.blocks_pushed + 1)}}
    assert_fails_only(await broken_suite("prefill", worker[1], ("P1", "P2", "P8"), breaker), "P2")


async def test_prefill_conforms(worker, nats) -> None:  # noqa: ANN001
    service, endpoint = worker
    results = await suite("prefill", endpoint, nats=nats.url, drain_pid=service.pid)
    assert_conforms(results)
    assert len(results) == len(REGISTRY.clauses)
