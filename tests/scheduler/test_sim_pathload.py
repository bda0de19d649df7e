"""The path-load term (pathload.py): fitted on the probe's requests through the sim itself."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.meshcal import MeshCalibration, Samples, fit_path_load
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.pathload import (
    LONE_RUN, followed, fit_request_s_per_rps, others_rate, path_offset, residual_line, residual_noise, runs_of, sim_ttfts,
    stepped_arrivals, trace_of,
)

CONFIG = SimConfig(num_workers=1, cost=CostModel(1e-5, 1e-3, 1e-4),
                   mesh=MeshCost(request_overhead_s=0.006, request_busy_s=0.001, hit_s_per_token=2e-6, noise=(0.9, 1.0, 1.1)))
PREFIX, FRESH, OUTPUT = 768, 192, 48


def probe_runs(rates: tuple[float, ...], runs: int = 2, cycles: int = 2, block_s: float = 2.0,
               seed: int = 3) -> list[tuple[int, list[tuple[float, int]]]]:
    """Runs of (arrival, rate level): Poisson arrivals whose rate steps between `rates` every `block_s`."""
    rng = random.Random(seed)
    return [(run, stepped_arrivals(rates, cycles, block_s, rng)) for run in range(runs)]


def timed_by_the_sim(runs: list[tuple[int, list[tuple[float, int]]]], per_rps: float, config: SimConfig = CONFIG,
                     prefixes: int = 1) -> list[tuple]:
    """The probe's samples as a mesh that is the sim with this term would time them (with more than one
    shared prefix, taken in turn and recorded as the probe records them)."""
    config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, request_s_per_rps=per_rps))
    samples = []
    for run, arrivals in runs:
        requests = [(a, PREFIX, FRESH, OUTPUT, i % prefixes, 0.0) for i, (a, _) in enumerate(arrivals)]
        results = Cluster("kv_aware", config).run(trace_of(run, requests, 16))
        ttft = {r.request.request_id: r.ttft_s for r in results}
        samples += [(float(run), float(level), a, float(PREFIX), float(FRESH), float(OUTPUT),
                     *((float(i % prefixes),) if prefixes > 1 else ()), ttft[f"load{run}-{i}"])
                    for i, (a, level) in enumerate(arrivals)]
    return samples


def lone_by_the_sim(count: int, config: SimConfig = CONFIG) -> list[tuple]:
    """The probe's lone requests (run LONE_RUN), as the sim times each alone (10 s apart)."""
    lone = trace_of(9999, [(10.0 * i, PREFIX, FRESH, OUTPUT, 0, 0.0) for i in range(count)], 16)
    results = Cluster("kv_aware", config).run(lone)
    return [(LONE_RUN, 0.0, 0.0, float(PREFIX), float(FRESH), float(OUTPUT), r.ttft_s)
            for r in results if "prime" not in r.request.request_id]


def test_timings_the_sim_made_with_a_known_term_give_that_term_back() -> None:
    runs = probe_runs((10.0, 20.0, 30.0))
    for per_rps in (0.0004, 0.0015):
        assert fit_request_s_per_rps(timed_by_the_sim(runs, per_rps), CONFIG) == pytest.approx(per_rps, rel=1e-4)


def test_a_host_slower_or_faster_by_a_constant_than_the_calibration_says_gets_the_same_term() -> None:
    """The offset is fitted beside the term: a constant on every request is not a slope."""
    samples = timed_by_the_sim(probe_runs((10.0, 20.0, 30.0)), 0.0006)
    assert fit_request_s_per_rps(samples, CONFIG) == pytest.approx(0.0006, rel=1e-4)
    assert path_offset(samples, CONFIG, 0.0006) == pytest.approx(0.0, abs=1e-9)
    for offset in (0.004, -0.002):
        shifted = [(*s[:6], s[6] + offset) for s in samples]
        assert fit_request_s_per_rps(shifted, CONFIG) == pytest.approx(0.0006, rel=1e-4)
        assert path_offset(shifted, CONFIG, 0.0006) == pytest.approx(offset, rel=1e-6)


def test_lone_requests_slower_than_the_loaded_ones_do_not_take_the_slope_out() -> None:
    """Runs BU/BV: the lone requests on an idle host read 6-7 ms over the sim's while the lowest level met
    it; as an anchor they took the whole rise with the rate out. They no longer move the fit."""
    loaded = timed_by_the_sim(probe_runs((10.0, 20.0, 30.0)), 0.0006)
    slow_lone = [(*s[:6], s[6] + 0.007) for s in lone_by_the_sim(5)]
    assert fit_request_s_per_rps(slow_lone + loaded, CONFIG) == pytest.approx(0.0006, rel=1e-4)


def test_the_residual_line_is_least_squares_with_an_intercept_and_through_the_origin_at_one_rate() -> None:
    rates = [10.0, 20.0, 30.0]
    assert residual_line(rates, [0.003, 0.005, 0.007], [0.0] * 3) == pytest.approx((0.0002, 0.001))
    assert residual_line(rates, [0.013, 0.015, 0.017], [0.010] * 3) == pytest.approx((0.0002, 0.001))
    assert residual_line([10.0, 10.0], [0.003, 0.005], [0.0, 0.0]) == pytest.approx((0.0004, 0.0))


def test_a_mesh_no_slower_under_traffic_than_the_sim_without_the_term_gets_none() -> None:
    runs = probe_runs((10.0, 30.0))
    assert fit_request_s_per_rps(timed_by_the_sim(runs, 0.0), CONFIG) == 0.0
    faster = [(*s[:6], s[6] - 0.002) for s in timed_by_the_sim(runs, 0.0)]
    assert fit_request_s_per_rps(faster, CONFIG) == 0.0  # never below zero
    assert fit_request_s_per_rps([], CONFIG) == 0.0


def test_the_runs_share_a_cached_prefix_and_the_term_counts_the_requests_before_each_not_itself() -> None:
    # three requests 0.1 s apart, then one 2 s later: it had nobody in the second before it
    trace = trace_of(0, [(0.0, 64, 32, 2, 0, 0.0), (0.1, 64, 32, 2, 0, 0.0), (0.2, 64, 32, 2, 0, 0.0), (2.2, 64, 32, 2, 0, 0.0)], 16)
    assert trace[0].request_id == "load0-prime" and all(r.hash_ids[:4] == trace[0].hash_ids[:4] for r in trace)
    assert len({r.hash_ids[4:] for r in trace}) == len(trace)  # each its own blocks after the prefix
    with_term = Cluster("kv_aware", SimConfig(num_workers=4, cost=CONFIG.cost, mesh=MeshCost(request_s_per_rps=0.01))).run(trace)
    without = Cluster("kv_aware", SimConfig(num_workers=4, cost=CONFIG.cost)).run(trace)
    extra = {a.request.request_id: a.ttft_s - b.ttft_s
             for a in with_term for b in without if a.request.request_id == b.request.request_id}
    assert [round(extra[f"load0-{i}"], 6) for i in range(4)] == [0.0, 0.01, 0.02, 0.0]
    assert others_rate([0.0, 0.1, 0.2, 2.2]) == pytest.approx((0 + 1 + 2 + 0) / 4)


def test_a_prefix_per_worker_is_primed_at_once_and_each_request_shares_only_its_own() -> None:
    trace = trace_of(0, [(0.0, 64, 32, 2, 0, 0.0), (0.1, 64, 32, 2, 1, 0.0), (0.2, 64, 32, 2, 0, 0.0)], 16)
    primes, requests = trace[:2], trace[2:]
    assert [p.request_id for p in primes] == ["load0-prime", "load0-1prime"] and {p.arrival_s for p in primes} == {0.0}
    assert primes[0].hash_ids[:4] != primes[1].hash_ids[:4]
    assert [r.hash_ids[:4] for r in requests] == [primes[0].hash_ids[:4], primes[1].hash_ids[:4], primes[0].hash_ids[:4]]
    # the two primes sent at once land on the two workers, and each prefix's requests follow it
    results = Cluster("kv_aware", dataclasses.replace(CONFIG, num_workers=2)).run(trace)
    worker = {r.request.request_id: r.decode_id for r in results}
    assert worker["load0-prime"] != worker["load0-1prime"]
    assert worker["load0-0"] == worker["load0-2"] == worker["load0-prime"] and worker["load0-1"] == worker["load0-1prime"]


def test_two_workers_probed_over_two_prefixes_give_a_known_term_back_and_old_samples_read_as_one_prefix() -> None:
    config = dataclasses.replace(CONFIG, num_workers=2)
    runs = probe_runs((10.0, 20.0, 30.0))
    samples = lone_by_the_sim(5, config) + timed_by_the_sim(runs, 0.0008, config, prefixes=2)
    assert {len(s) for s in samples if s[0] >= 0} == {8}
    assert fit_request_s_per_rps(samples, config) == pytest.approx(0.0008, rel=1e-4)
    assert {r[4] for run in runs_of(samples)[0] for r in run} == {0, 1}
    old = timed_by_the_sim(runs, 0.0008, config)  # one prefix, 7 fields: an earlier probe's saved samples
    assert {len(s) for s in old} == {7} and {r[4] for run in runs_of(old)[0] for r in run} == {0}


def test_the_calibration_fits_the_term_when_the_probe_ran() -> None:
    cal = MeshCalibration(prefill_s_per_token=1e-5, decode_s_per_step=1e-3, decode_s_per_seq=1e-4, request_overhead_s=0.006,
                          request_busy_s=0.001, token_overhead_s=0.0, hit_s_per_token=2e-6, prefill_stall=0.0,
                          prefill_share=0.0, admission_limit=None, noise=(0.9, 1.0, 1.1))
    cost, mesh = cal.costs(admission_limit=64)
    config = SimConfig(num_workers=1, cost=cost, mesh=mesh)
    runs = probe_runs((10.0, 25.0))
    samples = Samples(load=lone_by_the_sim(5, config) + timed_by_the_sim(runs, 0.0007, config))
    assert fit_path_load(samples, cal, 1).request_s_per_rps == pytest.approx(0.0007, rel=1e-4)
    assert [len(r) for r in runs_of(samples.load)[0]] == [len(a) for _, a in runs]  # the lone requests are not a run
    assert "--request-s-per-rps 0.0007" in " ".join(dataclasses.replace(cal, request_s_per_rps=0.0007).sim_flags())


def test_the_calibration_prints_the_lone_median_then_each_rate_levels_rate_and_median() -> None:
    from kvmesh.scheduler.sim.meshcalcli import path_load_line

    # level 1: 11 requests 0.1 s apart (0, 1, .. 10 before each: 5 a second); level 0: 3 requests 1.1 s apart after them
    load = [(-1.0, 0.0, 0.0, 768.0, 192.0, 48.0, 0.015), (-1.0, 0.0, 0.0, 768.0, 192.0, 48.0, 0.017)]
    load += [(0.0, 1.0, 0.1 * i, 768.0, 192.0, 48.0, 0.020) for i in range(11)]
    load += [(0.0, 0.0, 3.0 + 1.1 * i, 768.0, 192.0, 48.0, 0.012) for i in range(3)]
    assert path_load_line(Samples(load=load)) == "lone 16.0 ms, 0/s 12.0 ms, 5/s 20.0 ms"
    assert path_load_line(Samples()) == "not probed"
    with_cpu = Samples(load=load, load_cpu=[(0.0, 40.0, 1920.0, 1.0), (1.0, 60.0, 2880.0, 2.0)])
    assert path_load_line(with_cpu) == "lone 16.0 ms, 0/s 12.0 ms, 5/s 20.0 ms, host CPU outside the engines 30.0 ms a request"


def test_the_probes_rate_steps_through_every_level_each_cycle_in_blocks() -> None:
    arrivals = stepped_arrivals((5.0, 50.0), cycles=3, block_s=2.0, rng=random.Random(1))
    assert [a for a, _ in arrivals] == sorted(a for a, _ in arrivals) and all(0 <= a < 12.0 for a, _ in arrivals)
    for cycle in range(3):  # each cycle's two blocks hold one level each, both levels
        blocks = [{lv for a, lv in arrivals if start <= a < start + 2.0} for start in (4.0 * cycle, 4.0 * cycle + 2.0)]
        assert sorted(min(b) for b in blocks) == [0, 1] and all(len(b) == 1 for b in blocks)
    fast = sum(1 for _, lv in arrivals if lv == 1)
    assert 200 < fast < 400 and sum(1 for _, lv in arrivals if lv == 0) < fast / 4  # ~300 and ~30



def test_timings_the_sim_made_without_noise_leave_no_residual_spread() -> None:
    quiet = dataclasses.replace(CONFIG, mesh=dataclasses.replace(CONFIG.mesh, noise=()))
    samples = lone_by_the_sim(5, quiet) + timed_by_the_sim(probe_runs((10.0, 20.0, 30.0)), 0.0006, quiet)
    assert residual_noise(samples, CONFIG, 0.0006) == pytest.approx((1.0,) * 10, abs=1e-9)  # CONFIG's own noise is not used
    slower = [(*s[:6], s[6] + 0.003) for s in samples]  # a slower host: the fitted offset, not a spread
    assert residual_noise(slower, CONFIG, 0.0006) == pytest.approx((1.0,) * 10, abs=1e-9)
    assert residual_noise([], CONFIG, 0.0) == ()


def test_a_known_spread_of_first_tokens_comes_back_as_the_noise_and_the_calibration_takes_it() -> None:
    spread = (0.6, 0.8, 0.9, 1.0, 1.0, 1.0, 1.1, 1.3, 1.6, 2.2)
    noisy = dataclasses.replace(CONFIG, mesh=dataclasses.replace(CONFIG.mesh, noise=spread))
    runs = probe_runs((5.0, 10.0), runs=3, cycles=3)
    samples = lone_by_the_sim(5, dataclasses.replace(noisy, mesh=dataclasses.replace(noisy.mesh, noise=()))) + \
        timed_by_the_sim(runs, 0.0005, noisy)
    noise = residual_noise(samples, CONFIG, 0.0005)
    assert len(noise) == 10 and noise[4] <= 1.0 <= noise[5]
    assert noise[0] == pytest.approx(0.6, abs=0.08) and noise[-1] == pytest.approx(2.2, abs=0.25)
    assert noise[-2] / noise[1] == pytest.approx(1.6 / 0.8, rel=0.15)
    cal = MeshCalibration(prefill_s_per_token=1e-5, decode_s_per_step=1e-3, decode_s_per_seq=1e-4, request_overhead_s=0.006,
                          request_busy_s=0.001, token_overhead_s=0.0, hit_s_per_token=2e-6, prefill_stall=0.0,
                          prefill_share=0.0, admission_limit=None, noise=(0.9, 1.0, 1.1))
    fitted = fit_path_load(Samples(load=samples), cal, 1)
    assert fitted.noise[-1] > 1.8 and fitted.noise == pytest.approx(residual_noise(samples, CONFIG, fitted.request_s_per_rps))
    assert fit_path_load(Samples(), cal, 1).noise == (0.9, 1.0, 1.1)  # no path-load probe: the noise as it was


def test_a_request_the_sim_refuses_counts_as_its_deadline_in_the_fit_and_a_run_the_sim_does_not_follow_adds_no_noise() -> None:
    crowded = dataclasses.replace(CONFIG, mesh=dataclasses.replace(CONFIG.mesh, admission_limit=1, admission_queue_factor=1.0))
    burst = trace_of(0, [(0.0, PREFIX, FRESH, OUTPUT, 0, 0.0)] * 6, 16)
    served = sim_ttfts(crowded, burst, 0.0, "kv_aware")
    counted = sim_ttfts(crowded, burst, 0.0, "kv_aware", refused_s=30.0)
    assert len(served) < 6 and len(counted) == 6
    assert all(counted[k] == 30.0 for k in counted.keys() - served.keys())
    # the probe's timings from a mesh that kept up, fitted with a sim that refuses some: no crash, and
    # the runs it does not follow give no noise
    samples = lone_by_the_sim(5) + timed_by_the_sim(probe_runs((10.0, 20.0, 30.0)), 0.0)
    assert fit_request_s_per_rps(samples, crowded) == 0.0
    assert residual_noise(samples, crowded, 0.0) == ()
    assert len(residual_noise(samples, CONFIG, 0.0)) == 10


def test_a_run_is_followed_when_the_sims_p90_stays_within_twice_the_probes_at_every_level() -> None:
    near = [((0, 0), 0.02, 0.03)] * 9 + [((0, 0), 0.05, 0.09), ((0, 1), 0.03, 0.03)]
    assert followed(near)
    assert not followed(near + [((0, 1), 0.03, 0.5)] * 3)  # one level's tail ran away
    assert not followed([((0, 0), 0.02, float("inf"))] * 4)  # refused
