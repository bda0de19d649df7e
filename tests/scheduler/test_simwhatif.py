"""bench/simwhatif.py: a saved probe set loads back as the Samples it was, and --set changes the fit."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvmesh.scheduler.sim.meshcal import fit, ttft_noise
from kvmesh.scheduler.sim.meshstats import around_median, noise_quantiles

from .benchmodule import bench_module
from .test_sim_calibrate import SHARED, formula_samples

def simwhatif():
    return bench_module("simwhatif")


def test_a_saved_probe_set_loads_back_and_fits_as_it_did(tmp_path) -> None:
    samples = formula_samples(SHARED, workers=2)
    path = tmp_path / "run.2w.json"
    path.write_text(json.dumps(dataclasses.asdict(samples)))  # what simfidelity --save-samples writes
    loaded = simwhatif().load_samples(str(path))
    assert loaded == samples
    assert fit(loaded, SHARED.decode_s_per_seq) == fit(samples, SHARED.decode_s_per_seq)


def test_set_changes_the_named_terms_and_refuses_an_unknown_one() -> None:
    module, samples = simwhatif(), formula_samples(SHARED, workers=2)
    cal = fit(samples, SHARED.decode_s_per_seq)
    got = module.changed(cal, samples, ["host_parallelism=2", "pause_s=0.5"], "fitted")
    assert (got.host_parallelism, got.pause_s) == (2.0, 0.5)
    assert dataclasses.replace(got, host_parallelism=cal.host_parallelism, pause_s=cal.pause_s) == cal
    with pytest.raises(SystemExit):
        module.changed(cal, samples, ["no_such_term=1"], "fitted")


def test_noise_keeps_the_fitted_spread_or_takes_the_one_beside_streams_or_alone() -> None:
    module = simwhatif()
    samples = dataclasses.replace(formula_samples(SHARED, workers=2), ttft=[(64, 0.010), (64, 0.012), (64, 0.020)])
    cal = dataclasses.replace(fit(samples, SHARED.decode_s_per_seq), noise=(0.5, 1.0, 2.0))  # as if from the path-load probe
    assert module.changed(cal, samples, [], "fitted").noise == (0.5, 1.0, 2.0)
    assert module.changed(cal, samples, [], "beside").noise == ttft_noise(samples)
    assert module.changed(cal, samples, [], "lone").noise == noise_quantiles(around_median(samples.ttft))


def test_policies_are_simulated_side_by_side_at_each_rate(tmp_path, capsys) -> None:
    path = tmp_path / "run.2w.json"
    path.write_text(json.dumps(dataclasses.asdict(formula_samples(SHARED, workers=2))))
    simwhatif().main([str(path), "--rates", "4", "--policies", "round_robin,kv_aware", "--duration-s", "6", "--warmup-s", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "req/s " in line]
    assert [line.split(":")[0].split()[-1] for line in lines] == ["round_robin", "kv_aware"]
    assert all("hit " in line for line in lines)
