"""The engine process's step loop: one step frame per step with something due, none for a step
whose tokens are all held, at least one per `quiet_s` while busy; a failed step drops what was held."""

from __future__ import annotations

import pytest

from kvmesh.engine.outputs import RequestOutput
from kvmesh.worker import enginewire as wire
from kvmesh.worker.enginehost import EngineHost
from kvmesh.worker.outputhold import OutputHold
from tests.worker.holdengine import CountingEngine


def frames(host: EngineHost, steps: int) -> list[dict | None]:
    """Each step's frame header (None: no frame)."""
    out = []
    for _ in range(steps):
        data = host._step()
        out.append(None if data is None else wire.split(data[wire.PREFIX.size :], wire.PREFIX.unpack_from(data)[0])[0])
    return out


def tokens(header: dict | None) -> dict[str, list[int]]:
    return {} if header is None else {w[0]: w[1] for w in header["o"]}


def test_held_steps_send_no_frame_and_every_fourth_step_sends_every_requests_tokens() -> None:
    host = EngineHost(CountingEngine(2, 10), None, {}, hold=OutputHold(4, 2), quiet_s=60.0)
    sent = frames(host, 10)
    assert [tokens(h) for h in sent] == [
        {"r0": [1], "r1": [1]}, {}, {}, {}, {"r0": [2, 3, 4, 5], "r1": [2, 3, 4, 5]}, {}, {}, {},
        {"r0": [6, 7, 8, 9], "r1": [6, 7, 8, 9]}, {"r0": [10], "r1": [10]},
    ]
    assert [h is None for h in sent] == [False, True, True, True, False, True, True, True, False, False]
    assert [h["n"] for h in sent if h is not None] == [1, 5, 9, 10]  # the engine's step count, skipped steps too
    assert sent[-1]["w"] is False and all(h["w"] for h in sent[:-1] if h is not None)


def test_a_busy_engine_sends_a_frame_at_least_every_quiet_s_even_with_everything_held() -> None:
    host = EngineHost(CountingEngine(2, 9), None, {}, hold=OutputHold(4, 2), quiet_s=0.0)
    sent = frames(host, 3)
    assert all(h is not None for h in sent) and [tokens(h) for h in sent[1:]] == [{}, {}]
    assert sent[1]["s"][0] == 2  # the stats go with it: two requests running


def test_below_the_load_that_holds_every_step_sends_its_tokens() -> None:
    host = EngineHost(CountingEngine(1, 3), None, {}, hold=OutputHold(4, 2), quiet_s=60.0)
    assert [tokens(h) for h in frames(host, 3)] == [{"r0": [1]}, {"r0": [2]}, {"r0": [3]}]


@pytest.mark.filterwarnings("ignore")
def test_a_failed_step_is_reported_at_once_and_the_next_hold_begins_anew() -> None:
    host = EngineHost(CountingEngine(2, 12, fail_at=3), None, {}, hold=OutputHold(4, 2), quiet_s=60.0)
    sent = frames(host, 8)
    assert sent[1] is None and sent[2]["x"] == ["RuntimeError", "kernel failed"] and tokens(sent[2]) == {}
    # the hold that began on step 2 is forgotten: step 4 begins another, which goes on its fourth step
    assert [h is None for h in sent[3:]] == [True, True, True, False, True]
    assert tokens(sent[6]) == {"r0": [2, 3, 4, 5, 6], "r1": [2, 3, 4, 5, 6]}


class EventEngine(CountingEngine):
    """Also reports a KV cache event ("stored", its step's hash) every step."""

    def take_kv_events(self) -> list:
        return [("stored", [bytes([self.steps]) * 32], None)]


def test_kv_events_wait_for_the_next_frame_in_order_and_go_at_once_when_the_engine_is_idle() -> None:
    engine = EventEngine(2, 6)
    host = EngineHost(engine, None, {}, hold=OutputHold(4, 2), quiet_s=60.0)
    sent = frames(host, 6)
    assert [h is None for h in sent] == [False, True, True, True, False, False]
    stored = [[hashes[0][:2] for _, hashes, _ in h["e"]] for h in sent if h is not None]
    assert stored == [["01"], ["02", "03", "04", "05"], ["06"]]
    # idle now: a command's step (no outputs) still sends its events at once
    frame = frames(host, 1)[0]
    assert frame is not None and [hashes[0][:2] for _, hashes, _ in frame["e"]] == ["07"] and frame["w"] is False


class Clock:
    """time.monotonic / perf_counter / sleep for the engine host, advanced by the engine's steps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class TimedEngine(CountingEngine):
    """A CountingEngine whose every step takes `step_s` on `clock`."""

    def __init__(self, clock: Clock, step_s: float, requests: int, tokens: int) -> None:
        super().__init__(requests, tokens)
        self.clock, self.step_s = clock, step_s

    def step(self, hold: bool = False) -> list[RequestOutput]:
        self.clock.now += self.step_s
        return super().step(hold)


@pytest.mark.parametrize(("quiet_s", "stats_only"), [(None, 0), (0.02, 12)])
def test_a_hold_is_not_preceded_by_a_frame_of_stats_alone(monkeypatch, quiet_s, stats_only) -> None:
    # NOTE: 3 ms steps and a 20 ms hold: the hold goes on its seventh step, 21 ms after the last frame.
    # A frame every 20 ms (the old quiet_s) went one step before it, with nothing but stats.
    from kvmesh.worker import enginehost

    clock = Clock()
    monkeypatch.setattr(enginehost, "time", clock)
    hold = OutputHold(8, 2, 0.020)
    host = EngineHost(TimedEngine(clock, 0.003, 2, 100), None, {}, hold=hold,
                      quiet_s=enginehost.quiet_for(hold) if quiet_s is None else quiet_s)
    sent = [h for h in frames(host, 100) if h is not None]
    assert sum(1 for h in sent if not tokens(h)) == stats_only
    assert sum(len(t) for h in sent for t in tokens(h).values()) == 200  # every token, once


def test_the_quiet_interval_outlasts_the_holds_time_bound() -> None:
    from kvmesh.worker.enginehost import quiet_for

    assert quiet_for(OutputHold(8, 16, 0.020)) == 0.05 and quiet_for(OutputHold(8, 16, 0.1)) == 0.2
