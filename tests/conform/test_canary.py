"""Our canary passes `kvmesh conform canary` against the suite's fake scheduler and candidate
worker; a proxy that reports no verdict fails C2."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvmesh.conform.canary import REGISTRY
from kvmesh.runtime.launcher import free_port

from .breaker import changed
from .conftest import Service, assert_conforms, assert_fails_only, broken_suite, suite


@pytest.fixture(scope="module")
def canary(nats, tmp_path_factory) -> Iterator[tuple[str, int]]:  # noqa: ANN001
    port, scheduler_port = free_port(), free_port()
    service = Service("canary", ["--port", str(port), "--http-port", str(free_port()), "--scheduler",
                                 f"127.0.0.1:{scheduler_port}"],
                      {"KVMESH_NATS_URL": nats.url, "KVMESH_CANARY_NOISE_SAMPLE": "0"},
                      tmp_path_factory.mktemp("canary") / "canary.log")
    service.wait_grpc(f"127.0.0.1:{port}")
    yield f"127.0.0.1:{port}", scheduler_port
    service.stop()


async def test_broken_canary_fails_c2(canary, nats) -> None:  # noqa: ANN001
    breaker = {"replies": {"Canary/GetReport": lambda r: changed(r, verdict=0)}}
    # NOTE: only clauses that leave the scheduler alone: records replayed after this session's fake
    # scheduler is gone would put the canary's channel into reconnect backoff for the next session.
    results = await broken_suite("canary", canary[0], ("C1", "C2"), breaker, nats=nats.url, scheduler_port=canary[1])
    assert_fails_only(results, "C2")


async def test_canary_conforms(canary, nats) -> None:  # noqa: ANN001
    endpoint, scheduler_port = canary
    results = await suite("canary", endpoint, nats=nats.url, scheduler_port=scheduler_port)
    assert_conforms(results)
    assert len(results) == len(REGISTRY.clauses)
