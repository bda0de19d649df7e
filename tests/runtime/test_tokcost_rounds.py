"""bench/tokcost.py's rounds: every load on prompts of its own, each ratio against its own reference."""

from __future__ import annotations

import pytest

from tests.scheduler.benchmodule import bench_module


def tokcost():
    return bench_module("tokcost")


def test_every_load_gets_prompts_of_its_own() -> None:
    t = tokcost()
    firsts = [t.prompt_offset(r, level, 2, 128) for r in range(3) for level in range(2)]
    spans = [range(f, f + 128) for f in firsts]
    assert firsts[0] == 0
    assert all(a.stop <= b.start for a, b in zip(spans, spans[1:]))  # in order, none overlapping
    bodies = t._bodies("tiny", 4, 8, first=firsts[3])
    assert [b["messages"] for b in bodies] == [t.messages(firsts[3] + i) for i in range(4)]


def _load(cpu_s: float, engine_cpu_s: float) -> dict:
    return {"tokens": 1000, "wall_s": 1.0, "cpu_s": {"gateway": cpu_s * 0.2, "decode-0": cpu_s * 0.8},
            "engine": {"tokens": 1000, "wall_s": 0.8, "cpu_s": engine_cpu_s}}


def test_each_round_is_measured_against_its_own_reference() -> None:
    t = tokcost()
    figures = t.ratios(_load(0.2, 0.1))
    assert figures["cpu"] == pytest.approx(2.0)
    assert figures["throughput"] == pytest.approx(0.8)
    assert figures["gateway"] == pytest.approx(40.0)
    assert figures["decode above"] == pytest.approx(160.0 - 100.0)


@pytest.mark.parametrize(("ratios", "shown"), [([2.0, 1.5, 1.8], 1.8), ([2.0, 1.5], 1.5), ([1.7], 1.7)])
def test_the_median_round_is_shown(ratios: list[float], shown: float) -> None:
    t = tokcost()
    rounds = [_load(r * 0.1, 0.1) for r in ratios]
    assert t.ratios(t.median_round(rounds))["cpu"] == pytest.approx(shown)


def test_rounds_below_one_are_refused() -> None:
    with pytest.raises(SystemExit) as exit_:
        tokcost().main(["--rounds", "0"])
    assert exit_.value.code == 2
