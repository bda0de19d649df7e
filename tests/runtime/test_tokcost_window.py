"""bench/tokcost.py's measuring window: from the load's first request to its last hand-back."""

from __future__ import annotations

import time

from tests.scheduler.benchmodule import bench_module


def tokcost():
    return bench_module("tokcost")


def test_the_cpu_is_read_when_the_load_starts_not_when_the_client_does(monkeypatch) -> None:
    t = tokcost()
    readings = iter([1.0, 5.0, 9.0])  # at the client's spawn (unused), at start(), after it settled
    monkeypatch.setattr(t, "process_cpu_s", lambda _p: next(readings))
    monkeypatch.setattr(t, "_engine_cpu", lambda _p: None)
    next(readings)  # the client's start-up: before start() nothing is read
    order: list[str] = []

    def run(start) -> dict:
        order.append("client started")
        start()
        order.append("load")
        return {"tokens": 1}

    result, cpu, engines = t._cpu_around({"gateway": object()}, run, lambda: order.append("settled"))
    assert order == ["client started", "load", "settled"]
    assert cpu == {"gateway": 4.0} and engines == {} and result == {"tokens": 1}


def test_the_client_child_is_ready_only_once_built(monkeypatch) -> None:
    t = tokcost()
    sseload = bench_module("sseload")  # client_child imports it from sys.modules, where this leaves it
    events: list[str] = []
    monkeypatch.setattr(sseload, "main_sync", lambda url, bodies, c: events.append(f"load {len(bodies)}") or {})
    t.client_child("raw", "http://127.0.0.1:1", "tiny", 3, 2, 4, ready=lambda: events.append("ready"))
    assert events == ["ready", "load 3"]


def test_with_no_store_the_tail_waits_its_limit() -> None:
    wait = tokcost().handed_back("", {}, 8, limit_s=0.05, poll_s=0.01)
    t0 = time.monotonic()
    wait()
    assert 0.04 <= time.monotonic() - t0 < 1.0


def test_the_tail_ends_once_the_turns_are_looked_up_and_the_puts_hold_still(monkeypatch) -> None:
    t = tokcost()
    seen = iter([{"lookups": 4, "puts": 1}, {"lookups": 10, "puts": 2}, {"lookups": 10, "puts": 2}, {"lookups": 10, "puts": 2}])
    calls: list[int] = []

    def counts(_store: str) -> dict:
        calls.append(1)
        return next(seen)

    monkeypatch.setattr(t, "_store_counts", counts)
    t.handed_back("store:1", {"lookups": 2, "puts": 0}, 8, limit_s=5.0, poll_s=0.001)()
    assert len(calls) == 3  # 4-2 < 8 turns; then 8 turns but puts moved; then still: done
