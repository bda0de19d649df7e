"""The mesh's correlated pauses: found in a probe run's token times (meshstreams.steady_run), fitted
as a rate and a length (meshcal.py), and simulated as a worker stopping all its streams at once."""

import dataclasses

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.meshcal import fit
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.meshstreams import steady_itl, steady_run
from kvmesh.scheduler.sim.report import outcome
from kvmesh.scheduler.sim.trace import TraceRequest
from tests.scheduler.test_sim_calibrate import TRUE, formula_samples


def streams(n: int, paused: dict[int, float], at: float = 0.1, gap: float = 0.005, tokens: int = 64) -> list[list[float]]:
    """n streams with a token every `gap` s; those in `paused` wait that much longer once, at `at`."""
    out = []
    for i in range(n):
        t, times = 0.001 * i, []
        for _ in range(tokens):
            t += gap + (paused.get(i, 0.0) if times and times[-1] < at <= t + gap else 0.0)
            times.append(t)
        out.append(times)
    return out


def test_a_gap_most_of_a_workers_streams_share_is_a_pause_and_leaves_the_itl():
    run = steady_run(streams(8, {i: 0.05 for i in range(6)}), per_worker=8)
    assert run.pauses_s == pytest.approx((0.05,), rel=1e-6)
    assert run.itl_s == pytest.approx(0.005, rel=1e-6)  # the pause taken out
    assert steady_itl(streams(8, {i: 0.05 for i in range(6)})) > 0.0055  # steady_itl keeps it
    assert run.window_s == pytest.approx(0.006 + 64 * 0.005 - (0.007 + 0.005), rel=1e-6)  # last first token to first last


def test_a_gap_few_streams_share_is_not_a_pause_and_two_workers_pausing_at_once_are_two():
    assert steady_run(streams(8, {0: 0.05, 1: 0.05}), per_worker=8).pauses_s == ()
    assert steady_run(streams(8, {i: 0.05 for i in range(8)}), per_worker=4).pauses_s == pytest.approx((0.05, 0.05), rel=1e-6)
    assert steady_run(streams(8, {i: 0.05 for i in range(8)})).pauses_s == ()  # not looked for


def test_the_fit_takes_the_pauses_rate_over_the_time_searched_and_their_mean_length():
    samples = formula_samples(TRUE)
    samples.pause_window_s, samples.pauses = 6.0, [0.04, 0.05, 0.06]
    got = fit(samples)
    assert (got.pause_rate_hz, got.pause_s) == pytest.approx((0.5, 0.05), rel=1e-9)
    assert "--pause-rate-hz 0.5 --pause-s 0.05" in got.sim_flags()
    assert fit(formula_samples(TRUE)).pause_rate_hz == 0.0


def run(mesh: MeshCost, requests: list[TraceRequest]):
    cost = CostModel(prefill_s_per_token=1e-4, decode_s_per_step=1e-3, decode_s_per_seq=0.0)
    return [outcome(r) for r in Cluster("round_robin", SimConfig(num_workers=1, cost=cost, mesh=mesh)).run(requests)]


def test_a_paused_worker_stops_all_its_streams_together_by_whole_pauses():
    requests = [TraceRequest(0.0, f"r{j}", "", 64, 2000, (j,)) for j in range(4)]
    plain = run(MeshCost(), requests)
    paused = run(MeshCost(pause_rate_hz=2.0, pause_s=0.05), requests)
    delays = [p.finish_s - q.finish_s for p, q in zip(paused, plain, strict=True)]
    assert delays[0] > 0 and delays == pytest.approx([delays[0]] * 4, abs=1e-9)  # every stream, the same pauses
    assert delays[0] / 0.05 == pytest.approx(round(delays[0] / 0.05), abs=1e-6)  # whole pauses only


def test_a_pause_delays_the_first_tokens_of_the_prefills_it_hits():
    requests = [TraceRequest(0.0, f"r{j}", "", 2048, 2, tuple(range(200 * j, 200 * j + 128))) for j in range(20)]
    plain = run(MeshCost(), requests)
    paused = run(MeshCost(pause_rate_hz=5.0, pause_s=0.05), requests)
    delays = [p.ttft_s - q.ttft_s for p, q in zip(paused, plain, strict=True)]
    assert delays[-1] > 0 and all(b >= a - 1e-9 for a, b in zip(delays, delays[1:], strict=False))  # queued ones wait for each
    assert all(d / 0.05 == pytest.approx(round(d / 0.05), abs=1e-6) for d in delays)


def test_pauses_are_off_by_default_and_in_the_flags_only_when_measured():
    assert MeshCost().pause_rate_hz == 0.0
    assert not any("pause" in f for f in dataclasses.replace(TRUE, pause_rate_hz=0.0).sim_flags())
