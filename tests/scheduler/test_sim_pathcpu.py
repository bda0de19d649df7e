"""The host CPU a trace-like request costs beyond the per-step and per-token terms (pathcpu.py), and
fit_path_load charging it with several workers on the host."""

from __future__ import annotations

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import SimConfig
from kvmesh.scheduler.sim.meshcal import MeshCalibration, Samples, fit_path_load, path_load_config
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.pathcpu import excess_per_request, request_cpu_s, run_steps
from kvmesh.scheduler.sim.pathload import runs_of, without_noise

from .test_sim_pathload import lone_by_the_sim, probe_runs, timed_by_the_sim

PER_STEP, PER_TOKEN = 6e-4, 4e-5
CONFIG = SimConfig(num_workers=2, cost=CostModel(1e-5, 1e-3, 1e-4),
                   mesh=MeshCost(request_overhead_s=0.006, request_busy_s=0.001, hit_s_per_token=2e-6, noise=(0.9, 1.1),
                                 host_parallelism=2.0, host_cpu_s_per_request=0.003, host_cpu_s_per_step=PER_STEP,
                                 host_cpu_s_per_token=PER_TOKEN))


def cpu_runs(samples: list[tuple], per_request: float, config: SimConfig = CONFIG) -> list[tuple[float, float, float, float]]:
    """(run, requests, tokens, CPU s) as a host that spends `per_request` beyond the steps' and tokens' charges reads them."""
    out = []
    for run, requests in enumerate(runs_of(samples)[0]):
        steps, tokens = run_steps(without_noise(config), run, requests), float(sum(r[3] for r in requests))
        out.append((float(run), float(len(requests)), tokens, PER_STEP * steps + PER_TOKEN * tokens + per_request * len(requests)))
    return out


def test_excess_per_request_is_the_cpu_less_the_steps_and_tokens_charges_over_the_requests() -> None:
    assert excess_per_request(10.0, 400, 20_000, 8_000, 6e-4, 4e-5) == pytest.approx((10.0 - 4.8 - 0.8) / 400)
    assert excess_per_request(1.0, 100, 0, 0, 6e-4, 4e-5) == pytest.approx(0.01)


def test_a_host_spending_a_known_cost_a_request_gives_it_back() -> None:
    samples = timed_by_the_sim(probe_runs((10.0, 20.0, 30.0), runs=3), 0.0005, CONFIG)
    for per_request in (0.0, 0.017):
        assert request_cpu_s(samples, cpu_runs(samples, per_request), CONFIG) == pytest.approx(per_request, abs=1e-12)


def test_the_runs_are_matched_by_index_in_any_order_and_the_median_is_taken() -> None:
    samples = lone_by_the_sim(3, CONFIG) + timed_by_the_sim(probe_runs((10.0, 30.0), runs=3), 0.0005, CONFIG)
    rows = cpu_runs(samples, 0.010)
    rows[2] = (*rows[2][:3], rows[2][3] + 0.020 * rows[2][1])  # run 2 spent 30 ms a request: above the median
    assert request_cpu_s(samples, list(reversed(rows)), CONFIG) == pytest.approx(0.010, abs=1e-12)
    assert request_cpu_s(samples, rows[1:], CONFIG) == pytest.approx(0.020, abs=1e-12)  # runs 1 and 2: 10 and 30 ms


def test_no_cpu_reading_gives_none() -> None:
    samples = timed_by_the_sim(probe_runs((10.0, 20.0)), 0.0005, CONFIG)
    assert request_cpu_s(samples, [], CONFIG) is None
    assert request_cpu_s(samples, [(0.0, 0.0, 0.0, 1.0), (7.0, 100.0, 4800.0, 1.0)], CONFIG) is None  # none served; no such run


def calibration(parallel: float) -> MeshCalibration:
    return MeshCalibration(prefill_s_per_token=1e-5, decode_s_per_step=1e-3, decode_s_per_seq=1e-4, request_overhead_s=0.006,
                           request_busy_s=0.001, token_overhead_s=0.0, hit_s_per_token=2e-6, prefill_stall=1.0, prefill_share=0.0,
                           admission_limit=None, host_parallelism=parallel,
                           host_cpu_s_per_request=0.003, host_cpu_s_per_step=PER_STEP, host_cpu_s_per_token=PER_TOKEN)


def test_fit_path_load_charges_the_probes_cost_a_request_with_several_workers_only() -> None:
    cal = calibration(2.0)
    config = path_load_config(cal, 2)
    samples = timed_by_the_sim(probe_runs((10.0, 20.0, 30.0)), 0.0004, config)
    fitted = fit_path_load(Samples(load=samples, load_cpu=cpu_runs(samples, 0.016, config)), cal, 2)
    assert fitted.host_cpu_s_per_request == pytest.approx(0.016, abs=1e-12)
    assert "--host-cpu-s-per-request 0.016" in " ".join(fitted.sim_flags())
    below = fit_path_load(Samples(load=samples, load_cpu=cpu_runs(samples, 0.001, config)), cal, 2)
    assert below.host_cpu_s_per_request == 0.003  # never below the host-load probe's
    one = calibration(1.0)
    single = timed_by_the_sim(probe_runs((10.0, 20.0)), 0.0004, path_load_config(one, 1))
    kept = fit_path_load(Samples(load=single, load_cpu=cpu_runs(single, 0.016, path_load_config(one, 1))), one, 1)
    assert kept.host_cpu_s_per_request == 0.003
