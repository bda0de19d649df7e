"""bench/tokcost.py's output lengths (--vary-tokens) and its concurrency levels."""

from __future__ import annotations

import pytest

from tests.scheduler.benchmodule import bench_module


def tokcost():
    return bench_module("tokcost")


def test_one_length_for_all_unless_varied() -> None:
    assert tokcost().output_lengths(5, 128, False) == [128] * 5


@pytest.mark.parametrize("requests", [2, 7, 128, 1000])
def test_varied_lengths_spread_evenly_around_the_same_mean(requests: int) -> None:
    lengths = tokcost().output_lengths(requests, 128, True)
    assert len(lengths) == requests
    assert min(lengths) == 64 and max(lengths) == 192
    assert abs(sum(lengths) / requests - 128) < 1
    # every step of the spread once, shuffled: neighbours in the closed loop's order differ
    expected = sorted(64 + k * 128 // (requests - 1) for k in range(requests))
    assert sorted(lengths) == expected
    if requests > 2:
        assert lengths != sorted(lengths)


def test_the_client_and_the_engine_get_the_same_lengths() -> None:
    t = tokcost()
    bodies = t._bodies("tiny", 64, 128, vary=True)
    assert [b["max_tokens"] for b in bodies] == t.output_lengths(64, 128, True)


def test_a_concurrency_level_twice_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        tokcost().main(["--concurrency", "32,32"])
    assert exit_.value.code == 2
    assert "each level once" in capsys.readouterr().err
