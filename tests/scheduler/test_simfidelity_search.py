"""bench/simfidelity.py's real capacity search: a rate holds only when every replay of it holds."""

from __future__ import annotations

from kvmesh.scheduler.sim.report import RunSummary, capacity

from .benchmodule import bench_module


def every_run():
    return bench_module("simfidelity").every_run


def summary(rate: float, p99: float, errors: tuple = ()) -> RunSummary:
    return RunSummary("kv_aware", 1, rate, p99 / 2, p99, rate, 0.0, 0.0, 1.0, errors=errors)


class Replays:
    """A mesh whose replays at a rate give these p99s in turn (the last one repeats); a rate not
    listed fails."""

    def __init__(self, p99s: dict[float, list[float]]) -> None:
        self.p99s = p99s
        self.calls: list[float] = []

    def __call__(self, rate: float) -> RunSummary:
        seen = self.calls.count(rate)
        self.calls.append(rate)
        values = self.p99s.get(rate, [9.9])
        return summary(rate, values[min(seen, len(values) - 1)])


def test_a_rate_whose_second_replay_misses_the_slo_does_not_hold():
    replays = Replays({16.0: [0.3, 1.7]})
    result = every_run()(replays, 0.5, 2)(16.0)
    assert result.ttft_p99_s == 1.7 and not result.meets(0.5)
    assert replays.calls == [16.0, 16.0]


def test_a_failing_first_replay_decides_without_a_second():
    replays = Replays({16.0: [0.9, 0.1]})
    assert not every_run()(replays, 0.5, 2)(16.0).meets(0.5)
    assert replays.calls == [16.0]


def test_a_held_rate_answers_with_its_worst_replay():
    replays = Replays({8.0: [0.2, 0.4, 0.3]})
    assert every_run()(replays, 0.5, 3)(8.0).ttft_p99_s == 0.4


def test_one_lucky_replay_no_longer_sets_the_capacity():
    # Holds up to 12 req/s; at 16 the first replay holds (luck), the second collapses.
    p99s = {4.0: [0.1], 8.0: [0.2], 12.0: [0.3, 0.35], 16.0: [0.3, 1.7]}
    once, twice = Replays(p99s), Replays(p99s)
    assert capacity(once, 0.5, 4.0, 2)[0] == 16.0  # one replay per rate: 4, 8, 16 held; 32, 24, 20 failed
    assert capacity(every_run()(twice, 0.5, 2), 0.5, 4.0, 2)[0] == 12.0
