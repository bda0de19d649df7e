"""Our scheduler passes `kvmesh conform scheduler` (one process, every clause S1..); a proxy that
breaks one rule fails the intended clause."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvmesh.conform.scheduler import REGISTRY
from kvmesh.runtime.launcher import free_port

from .breaker import changed
from .conftest import Service, assert_conforms, assert_fails_only, broken_suite, suite


@pytest.fixture(scope="module")
def scheduler(nats, tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    port = free_port()
    service = Service("scheduler", ["--port", str(port), "--metrics-port", str(free_port())],
                      {"KVMESH_NATS_URL": nats.url, "KVMESH_SCHEDULER_HEARTBEAT_TIMEOUT_S": "1.5",
                       "KVMESH_SCHEDULER_REPLAY_TIMEOUT_S": "0.5", "KVMESH_SCHEDULER_RECONCILE_GRACE_S": "0.5"}, tmp_path_factory.mktemp("sched") / "scheduler.log")
    service.wait_grpc(f"127.0.0.1:{port}")
    yield f"127.0.0.1:{port}"
    service.stop()


BROKEN = {
    "S6": {"requests": {"Scheduler/Route": lambda r: changed(r, exclude_workers=[])}},
    "S14": {"replies": {"Scheduler/SetProductionPool": lambda r: changed(r, previous_pool="not-the-previous-pool")}},
    # Complete reports another request: the slot is never freed
    "S17": {"requests": {"Scheduler/Complete": lambda r: changed(r, request_id=f"{r.request_id}-lost")}},
    # a scheduler that keeps a Route queued after its caller's deadline passed or the caller cancelled
    "S18": {"detached": frozenset({"Scheduler/Route"})},
    # the proxy forwards no bidirectional call: a scheduler without the Routes stream
    "S19": {},
}
ONLY = {"S17": ("S1", "S4", "S17"), "S18": ("S1", "S4", "S18"), "S19": ("S1", "S4", "S19")}


@pytest.mark.parametrize("clause_id", sorted(BROKEN))
async def test_broken_scheduler_fails_the_clause(scheduler, nats, clause_id: str) -> None:  # noqa: ANN001
    only = ONLY.get(clause_id, ("S1", "S4", "S5", "S6", "S14"))
    results = await broken_suite("scheduler", scheduler, only, BROKEN[clause_id], nats=nats.url)
    assert_fails_only(results, clause_id)


async def test_scheduler_conforms(scheduler, nats) -> None:  # noqa: ANN001
    results = await suite("scheduler", scheduler, nats=nats.url)
    assert_conforms(results)
    assert len(results) == len(REGISTRY.clauses)
