"""The calibration's bootstrap (meshspread.py): the range of each term over refits of resampled
probe repeats is zero where the repeats agree and covers what one burst would have made of a term."""

import dataclasses
import random

import pytest

from kvmesh.scheduler.sim.meshcal import fit
from kvmesh.scheduler.sim.meshspread import bootstrap, resample, spread_lines, term_ranges

from .test_sim_calibrate import TRUE, formula_samples


def repeated(samples, times: int = 5):
    """Each probe point's timing `times` times, as the probes' repeats record it."""
    names = ("ttft", "itl", "itl_long", "burst", "pair", "stall", "hit", "hit_lone")
    return dataclasses.replace(samples, **{name: getattr(samples, name) * times for name in names})


def test_a_draw_keeps_each_points_count_and_draws_only_its_own_repeats():
    samples = repeated(formula_samples(TRUE))
    samples.ttft = [(n, t * f) for n, t in samples.ttft[:4] for f in (1.0, 1.1, 1.2)]
    drawn = resample(samples, random.Random(3))
    assert sorted(n for n, _ in drawn.ttft) == sorted(n for n, _ in samples.ttft)
    assert all((n, t) in samples.ttft for n, t in drawn.ttft)
    assert len(drawn.hit) == len(drawn.hit_lone) == len(samples.hit)
    pairs = set(zip(samples.hit, samples.hit_lone, strict=True))
    assert all(pair in pairs for pair in zip(drawn.hit, drawn.hit_lone, strict=True))  # a hit keeps its lone request


def test_where_every_repeat_agrees_each_terms_range_is_the_fit_itself():
    samples = repeated(formula_samples(TRUE))
    ranges = term_ranges(bootstrap(samples, draws=20, engine_decode_s_per_seq=TRUE.decode_s_per_seq))
    for name, (lo, hi) in ranges.items():
        assert lo == pytest.approx(hi, rel=1e-9, abs=1e-15), name
    assert ranges["request_overhead_s"][0] == pytest.approx(TRUE.request_overhead_s, rel=1e-9)


def test_a_burst_on_some_repeats_of_the_shortest_prompt_widens_the_overhead_range_over_it():
    samples = repeated(formula_samples(TRUE))
    samples.ttft = [(n, t + (0.030 if n == 64 and i % 5 < 2 else 0.0)) for i, (n, t) in enumerate(sorted(samples.ttft))]
    cal = fit(samples, TRUE.decode_s_per_seq)
    lo, hi = term_ranges(bootstrap(samples, draws=200, engine_decode_s_per_seq=TRUE.decode_s_per_seq))["request_overhead_s"]
    assert lo == pytest.approx(cal.request_overhead_s, rel=1e-9) == pytest.approx(TRUE.request_overhead_s, rel=1e-9)
    assert hi > lo + 0.005  # over a tenth of the draws got three of the burst's repeats in five: a median in it
    assert spread_lines(cal, {"request_overhead_s": (lo, hi)})[0].startswith(f"request-overhead-s {cal.request_overhead_s:.3g} (")



def test_the_path_load_term_is_held_at_the_callers_fit_on_every_draw():
    """Refitting it runs the sim on the probe's requests; the draws take it from `fitted`."""
    samples = repeated(formula_samples(TRUE))
    samples.load = [(0.0, 0.0, 0.1, 768.0, 192.0, 48.0, 0.02)]  # never refitted: the draws drop it
    fitted = dataclasses.replace(fit(dataclasses.replace(samples, load=[]), TRUE.decode_s_per_seq), request_s_per_rps=3e-4)
    draws = bootstrap(samples, draws=5, engine_decode_s_per_seq=TRUE.decode_s_per_seq, fitted=fitted)
    assert {d.request_s_per_rps for d in draws} == {3e-4}
    assert {d.request_s_per_rps for d in bootstrap(dataclasses.replace(samples, load=[]), draws=5)} == {0.0}
