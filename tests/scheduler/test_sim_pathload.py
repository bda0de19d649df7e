"""The path-load term (pathload.py): fitted on the probe's requests through the sim itself."""

from __future__ import annotations

import random

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.meshcal import Samples, fit_path_load
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.pathload import fit_request_s_per_rps, others_rate, runs_of, trace_of

CONFIG = SimConfig(num_workers=1, cost=CostModel(1e-5, 1e-3, 1e-4),
                   mesh=MeshCost(request_overhead_s=0.006, request_busy_s=0.001, noise=(0.9, 1.0, 1.1)))


def probe_runs(rates: tuple[float, ...], seconds: float = 4.0, seed: int = 3) -> list[tuple[int, list[float]]]:
    rng = random.Random(seed)
    runs = []
    for i, rate in enumerate(rates):
        arrivals, t = [], 0.0
        while (t := t + rng.expovariate(rate)) < seconds:
            arrivals.append(t)
        runs.append((i, arrivals))
    return runs


def timed_by_the_sim(runs: list[tuple[int, list[float]]], per_rps: float, config: SimConfig = CONFIG) -> list[tuple]:
    """The probe's samples as a mesh that is the sim with this term would time them."""
    samples = []
    for run, arrivals in runs:
        requests = [(a, 256, 48, 0.0) for a in arrivals]
        mesh = MeshCost(**{**{f: getattr(config.mesh, f) for f in config.mesh.__slots__}, "request_s_per_rps": per_rps})
        results = Cluster("kv_aware", SimConfig(num_workers=config.num_workers, cost=config.cost, mesh=mesh)).run(
            trace_of(run, requests, config.cost.block_size))
        ttft = {r.request.request_id: r.ttft_s for r in results}
        samples += [(float(run), a, 256.0, 48.0, ttft[f"load{run}-{i}"]) for i, a in enumerate(arrivals)]
    return samples


def test_timings_the_sim_made_with_a_known_term_give_that_term_back() -> None:
    runs = probe_runs((10.0, 20.0, 30.0))
    for per_rps in (0.0004, 0.0015):
        assert fit_request_s_per_rps(timed_by_the_sim(runs, per_rps), CONFIG) == pytest.approx(per_rps, rel=1e-4)


def test_a_mesh_no_slower_under_traffic_than_the_sim_without_the_term_gets_none() -> None:
    runs = probe_runs((10.0, 30.0))
    assert fit_request_s_per_rps(timed_by_the_sim(runs, 0.0), CONFIG) == 0.0
    faster = [(*s[:4], s[4] - 0.002) for s in timed_by_the_sim(runs, 0.0)]
    assert fit_request_s_per_rps(faster, CONFIG) == 0.0  # never below zero
    assert fit_request_s_per_rps([], CONFIG) == 0.0


def test_the_term_adds_latency_per_request_a_second_before_each_one_not_counting_itself() -> None:
    # three requests 0.1 s apart, then one 2 s later: it had nobody in the second before it
    trace = trace_of(0, [(0.0, 32, 2, 0.0), (0.1, 32, 2, 0.0), (0.2, 32, 2, 0.0), (2.2, 32, 2, 0.0)], 16)
    mesh = MeshCost(request_s_per_rps=0.01)
    with_term = Cluster("kv_aware", SimConfig(num_workers=4, cost=CONFIG.cost, mesh=mesh)).run(trace)
    without = Cluster("kv_aware", SimConfig(num_workers=4, cost=CONFIG.cost)).run(trace)
    extra = {a.request.request_id: a.ttft_s - b.ttft_s
             for a in with_term for b in without if a.request.request_id == b.request.request_id}
    assert [round(extra[f"load0-{i}"], 6) for i in range(4)] == [0.0, 0.01, 0.02, 0.0]
    assert others_rate([0.0, 0.1, 0.2, 2.2]) == pytest.approx((0 + 1 + 2 + 0) / 4)


def test_the_calibration_fits_the_term_when_the_probe_ran() -> None:
    from kvmesh.scheduler.sim.meshcal import MeshCalibration

    cal = MeshCalibration(prefill_s_per_token=1e-5, decode_s_per_step=1e-3, decode_s_per_seq=1e-4, request_overhead_s=0.006,
                          request_busy_s=0.001, token_overhead_s=0.0, hit_s_per_token=0.0, prefill_stall=0.0,
                          prefill_share=0.0, admission_limit=None, noise=(0.9, 1.0, 1.1))
    cost, mesh = cal.costs(admission_limit=64)
    runs = probe_runs((10.0, 25.0))
    samples = Samples(load=timed_by_the_sim(runs, 0.0007, SimConfig(num_workers=1, cost=cost, mesh=mesh)))
    assert fit_path_load(samples, cal, 1) == pytest.approx(0.0007, rel=1e-4)
    assert [len(r) for r in runs_of(samples.load)] == [len(a) for _, a in runs]
    assert "--request-s-per-rps 0.0007" in " ".join(cal.__class__(**{**{f: getattr(cal, f) for f in cal.__slots__},
                                                                        "request_s_per_rps": 0.0007}).sim_flags())
