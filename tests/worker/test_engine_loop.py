"""EngineLoop: requests in, outputs out on the event loop, and the canary's slowdown knobs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from kvmesh.worker.worker import EngineLoop
from tests.fakeclock import FakeClock


@dataclass
class Out:
    request_id: str
    token: int
    finished: bool


@dataclass
class CountingEngine:
    """Emits tokens 0, 1, 2 for each request and then finishes it; each step takes `step_s`
    on the injected clock."""

    clock: FakeClock
    step_s: float = 0.01
    left: dict[str, int] = field(default_factory=dict)

    def add(self, request_id: str) -> None:
        self.left[request_id] = 3

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def step(self) -> list[Out]:
        self.clock.advance(self.step_s)
        outs = []
        for rid in list(self.left):
            self.left[rid] -= 1
            outs.append(Out(rid, 2 - self.left[rid], self.left[rid] == 0))
            if self.left[rid] == 0:
                del self.left[rid]
        return outs

    def abort_request(self, request_id: str) -> None:
        self.left.pop(request_id, None)

    def stats(self) -> dict:
        return {"running": len(self.left)}


async def run_one(loop: EngineLoop, engine: CountingEngine) -> list[int]:
    loop.start()
    try:
        stream = await loop.add_request("r1", lambda e: e.add("r1"))
        tokens: list[int] = []
        while not tokens or tokens[-1] != 2:
            tokens += [o.token for o in await stream.next_batch()]
        return tokens
    finally:
        await loop.stop()


@pytest.mark.parametrize(
    ("delay_s", "slowdown", "expected"),
    [(0.0, 1.0, []), (0.0, 10.0, [0.09] * 3), (0.05, 1.0, [0.05] * 3), (0.05, 3.0, [0.07] * 3)],
)
def test_every_step_sleeps_the_fixed_delay_plus_the_slowdown_of_its_own_duration(delay_s, slowdown, expected):
    clock = FakeClock()
    slept: list[float] = []
    engine = CountingEngine(clock)
    loop = EngineLoop(engine, step_delay_s=delay_s, step_slowdown=slowdown, clock=clock, sleep=slept.append)
    assert asyncio.run(run_one(loop, engine)) == [0, 1, 2]
    # NOTE: the first step runs as soon as the request is added; steps without work never sleep.
    assert slept[:3] == pytest.approx(expected)
    assert len(slept) == len(expected)


class StuckEngine:
    """Has work; `step` blocks until `release` is set (a hung kernel), or returns nothing (a
    prefill worker whose blocks are all held by requests waiting for release)."""

    def __init__(self, hang: bool) -> None:
        import threading

        self.hang = hang
        self.release = threading.Event()
        self.steps = 0

    def has_unfinished_requests(self) -> bool:
        return not self.release.is_set()

    def step(self) -> list:
        self.steps += 1
        if self.hang:
            self.release.wait(10)
        return []

    def stats(self) -> dict:
        return {}


async def test_a_stuck_engine_times_out_calls_and_trips_the_watchdog() -> None:
    """Issue 16 item 3: `call` gets UNAVAILABLE instead of hanging, and the watchdog deregisters."""
    from kvmesh.runtime.errors import Unavailable
    from kvmesh.worker.watchdog import watch_engine

    engine = StuckEngine(hang=True)
    loop = EngineLoop(engine, call_timeout_s=0.2)
    loop.start()
    tripped = asyncio.Event()

    async def on_stall() -> None:
        tripped.set()

    try:
        await asyncio.sleep(0.05)
        with pytest.raises(Unavailable):
            await loop.call(lambda e: None)
        await asyncio.wait_for(watch_engine(loop, stall_s=0.2, on_stall=on_stall, interval_s=0.05), 2.0)
        assert tripped.is_set() and loop.progress == 0
    finally:
        engine.release.set()
        await loop.stop()


async def test_an_engine_with_nothing_it_can_schedule_does_not_spin() -> None:
    """Issue 16 item 3: work pending but no step advances anything: the thread waits for a
    command (bounded) instead of stepping in a busy loop with the GIL held."""
    engine = StuckEngine(hang=False)
    loop = EngineLoop(engine, idle_wait_s=0.05)
    loop.start()
    try:
        await asyncio.sleep(0.5)
        assert engine.steps <= 20  # NOTE: a busy loop makes tens of thousands
        assert await loop.call(lambda e: "answered") == "answered"  # a command still runs at once
    finally:
        engine.release.set()
        await loop.stop()


class HoldingEngine:
    """`add` queues a request; `step` starts every waiting one (taking a block each) and then
    hangs until `release` is set, the way a long prefill or a hung kernel holds the thread."""

    def __init__(self) -> None:
        import threading

        self.waiting: list[str] = []
        self.running: list[str] = []
        self.free_blocks = 8
        self.in_step = threading.Event()
        self.release = threading.Event()

    def add(self, request_id: str) -> None:
        self.waiting.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running) and not self.release.is_set()

    def step(self) -> list:
        self.running += self.waiting
        self.free_blocks -= len(self.waiting)
        self.waiting = []
        self.in_step.set()
        self.release.wait(10)
        return []

    def abort_request(self, request_id: str) -> None:
        pass

    def stats(self):
        from kvmesh.engine.outputs import EngineStats

        return EngineStats(len(self.running), len(self.waiting), self.free_blocks, 8, 0, 0, 0, 0, 0)


async def test_a_heartbeat_reports_the_engine_as_it_is_when_published_not_after_the_last_step() -> None:
    """Issue 16 item 3 (heartbeats published cached stats): while a step holds the engine thread,
    a beat shows the requests that step started and the blocks they took, and the progress."""
    from kvmesh.worker.heartbeat import HeartbeatInfo, Heartbeater

    engine = HoldingEngine()
    loop = EngineLoop(engine)
    info = HeartbeatInfo("d1", "decode", "127.0.0.1:1", "production", "tiny", 16, 64, 0.0)
    beats = Heartbeater(None, info, lambda: loop.stats, 0.5, progress=lambda: loop.progress)
    loop.start()
    try:
        await loop.call(lambda e: (e.add("r1"), e.add("r2")))  # the step right after starts both
        assert await asyncio.to_thread(engine.in_step.wait, 5.0)
        hb = beats.message()
        assert (hb.num_running, hb.num_waiting, hb.kv_blocks_free) == (2, 0, 6)
        assert hb.reports_progress and hb.engine_progress == 0
    finally:
        engine.release.set()
        await loop.stop()


def test_a_burst_of_commands_wakes_the_event_loop_once_and_every_caller_gets_its_result() -> None:
    """Commands that wait together on the engine thread (a burst of arriving requests) hand their
    results to the event loop in one cross-thread call, in order; a failing one fails only its caller."""
    import threading

    engine = CountingEngine(FakeClock())
    loop = EngineLoop(engine, sleep=lambda s: None)
    gate, entered = threading.Event(), threading.Event()

    async def main() -> tuple[list, int]:
        loop.start()
        crossings = 0
        real = loop._loop.call_soon_threadsafe

        def counting(fn, *args):
            nonlocal crossings
            crossings += 1
            return real(fn, *args)

        loop._loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        try:
            loop.call_nowait(lambda e: (entered.set(), gate.wait(5)))  # holds the engine thread while the burst queues
            # NOTE: the burst queues once the engine thread is inside that command: before, a loaded host
            # could let the thread's batch take the first calls with it, and their results crossed apart
            await asyncio.to_thread(entered.wait, 5)
            calls = [asyncio.ensure_future(loop.call(lambda e, i=i: i * 10)) for i in range(5)]
            calls.append(asyncio.ensure_future(loop.call(lambda e: 1 / 0)))
            await asyncio.sleep(0.05)
            before = crossings
            gate.set()
            results = await asyncio.gather(*calls, return_exceptions=True)
            return results, crossings - before
        finally:
            await loop.stop()

    results, crossings = asyncio.run(main())
    assert results[:5] == [0, 10, 20, 30, 40]
    assert isinstance(results[5], ZeroDivisionError)
    assert crossings == 1


async def test_a_failure_after_the_step_fails_the_requests_and_the_loop_lives_on() -> None:
    """Holding the outputs (`hold`) needs the engine's stats; if that fails the step's requests
    fail as on a failed step, instead of the engine thread dying with them waiting forever."""
    from kvmesh.worker.outputhold import OutputHold

    engine = CountingEngine(FakeClock())  # its stats() has no num_running: the hold raises
    loop = EngineLoop(engine, hold=OutputHold(4, 1))
    loop.start()
    try:
        stream = await loop.add_request("r1", lambda e: e.add("r1"))
        with pytest.raises(AttributeError):
            await asyncio.wait_for(stream.next_batch(), 5)
        assert loop._thread.is_alive()
        assert await loop.call(lambda e: e.has_unfinished_requests(), timeout_s=5) is False  # aborted, still serving
    finally:
        await loop.stop()
