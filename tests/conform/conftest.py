"""Fixtures for the conformance suites: a real nats-server and real service processes, started
once per module; `conforms()` runs a role's suite and checks every clause passed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvmesh.conform.clauses import Outcome, Result
from kvmesh.conform.runner import Options, run
from kvmesh.runtime.launcher import free_port
from tests.conftest import NatsServer


@pytest.fixture(scope="module")
def nats() -> Iterator[NatsServer]:
    server = NatsServer(free_port())
    server.start()
    yield server
    server.stop()


class Service:
    """`python -m kvmesh SERVICE ARGS` with its log in `log_path`; `stop()` ends it."""

    def __init__(self, service: str, args: list[str], env: dict[str, str], log_path: Path, cwd: str | None = None,
                 argv: list[str] | None = None) -> None:
        self.log_path = log_path
        log = log_path.open("ab")
        self.proc = subprocess.Popen(argv or [sys.executable, "-m", "kvmesh", service, *args],
                                     env={**os.environ, "KVMESH_TRACING": "false", **env}, cwd=cwd,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_grpc(self, endpoint: str, timeout_s: float = 120.0) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(endpoint) as chan:
            stub = health_pb2_grpc.HealthStub(chan)
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.log_tail()}"
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise TimeoutError(f"{endpoint} never became healthy:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


async def suite(role: str, endpoint: str, **options) -> dict[str, Result]:
    """Runs `role`'s suite; results by clause id."""
    lines: list[str] = []
    results = await run(Options(role, endpoint, **options), emit=lines.append)
    print("\n".join(lines))
    return {r.clause.id: r for r in results}


def assert_conforms(results: dict[str, Result], skipped: set[str] = frozenset()) -> None:
    """No clause failed, and exactly `skipped` were skipped (a skip never hides a failure)."""
    failed = {cid: r.detail for cid, r in results.items() if r.outcome is Outcome.FAIL}
    assert not failed, failed
    assert {cid for cid, r in results.items() if r.outcome is Outcome.SKIP} == set(skipped), \
        {cid: r.detail for cid, r in results.items() if r.outcome is Outcome.SKIP}


async def broken_suite(role: str, target: str, only: tuple[str, ...], breaker_kwargs: dict, **options) -> dict[str, Result]:
    """`role`'s clauses `only` against a Breaker in front of `target`."""
    from .breaker import Breaker, start_breaker  # noqa: PLC0415

    breaker = Breaker(target, **breaker_kwargs)
    server, endpoint = await start_breaker(breaker)
    try:
        return await suite(role, endpoint, only=only, **options)
    finally:
        await server.stop(0)
        for orphan in list(breaker.orphans):
            orphan.cancel()


def assert_fails_only(results: dict[str, Result], clause_id: str) -> None:
    """The broken implementation fails `clause_id` and nothing else that ran."""
    outcomes = {cid: r.outcome for cid, r in results.items()}
    assert outcomes.pop(clause_id) is Outcome.FAIL, results[clause_id]
    assert all(o is Outcome.PASS for o in outcomes.values()), {c: results[c].detail for c in outcomes}
