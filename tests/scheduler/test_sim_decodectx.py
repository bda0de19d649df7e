"""The decode step's context cost (decodectx.py): a hinge in running × the longest context, which the
calibration fits exactly from timings it made and which the simulator's step cost follows."""

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.decodectx import fit_hinge, hinge_s, padded_tokens
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.report import outcome
from kvmesh.scheduler.sim.trace import TraceRequest

SLOPE, KNEE = 5.0e-7, 6000.0


@pytest.mark.parametrize("padded", [
    [4224, 4352, 6272, 6400, 8448, 12544, 16896],  # the probe's default points: two below the knee, five past it
    [6500, 9000, 30000],                 # all past it: the knee lies below every point
    [1000, 3000, 5999, 6001, 7000],      # two just past it
])
def test_the_fit_gives_back_a_hinge_from_the_timings_it_made(padded):
    points = [(t, hinge_s(t, SLOPE, KNEE)) for t in padded]
    assert fit_hinge(points) == pytest.approx((0.0, SLOPE, KNEE), rel=1e-9, abs=1e-15)


PER_TOKEN, STEEPER, LATER_KNEE = 4.5e-7, 8.5e-7, 12000.0


@pytest.mark.parametrize("padded", [
    [4224, 4352, 6400, 8448, 12544, 16896, 25088, 37632],  # the probe's points (run AF): five below the knee
    [2000, 13000, 20000],                                  # one below it, two past
])
def test_the_fit_gives_back_a_cost_from_the_first_token_that_steepens_past_a_knee(padded):
    points = [(t, hinge_s(t, STEEPER, LATER_KNEE, PER_TOKEN)) for t in padded]
    assert fit_hinge(points) == pytest.approx((PER_TOKEN, STEEPER, LATER_KNEE), rel=1e-9)


def test_run_afs_probe_points_cost_from_the_first_token():
    # the ITL probe's extra step time over the short streams' line (run AF, tiny, 1 worker): about
    # 0.45 µs per padded token from the first, steeper past ~12k; a hinge with nothing below its
    # knee priced 4-5k padded tokens (the trace's 3-4 rows of ~1.2k) at 0 against 1.7-2 ms measured
    points = [(4224, 1.9e-3), (4352, 1.65e-3), (6400, 2.75e-3), (8448, 4.05e-3), (12544, 5.8e-3), (16896, 11.3e-3),
              (25088, 25.4e-3), (37632, 37.7e-3)]
    per_token, slope, knee = fit_hinge(points)
    assert 3e-7 < per_token < 6e-7 and slope > per_token and 8000 < knee < 17000
    assert hinge_s(4300, slope, knee, per_token) == pytest.approx(1.8e-3, rel=0.2)


def test_weighted_the_fit_still_gives_back_a_hinge_it_made():
    padded = [4224, 4352, 6400, 8448, 12544, 16896, 25088, 37632]
    points = [(t, hinge_s(t, STEEPER, LATER_KNEE, PER_TOKEN)) for t in padded]
    weights = [1.0 / (2e-3 + e) for _, e in points]
    assert fit_hinge(points, weights) == pytest.approx((PER_TOKEN, STEEPER, LATER_KNEE), rel=1e-9)


def test_weighted_by_one_over_the_step_the_fit_follows_the_knees_onset():
    # run BB (tiny, 1 worker): 8 streams x 1,568 took 3.5 ms a step, 16 x 1,056 11.8, 24 x 1,568 24.2;
    # fitted on absolute errors the hinge followed the steep points and said 6.1 ms at the first
    steps = {4224: 2.06e-3, 6272: 2.39e-3, 8448: 2.63e-3, 12544: 3.51e-3, 16896: 11.84e-3, 25088: 18.33e-3, 37632: 24.19e-3}
    base = 1.9e-3
    points = [(t, s - base) for t, s in steps.items()]

    def error_at_onset(weights):
        per_token, slope, knee = fit_hinge(points, weights)
        return abs(base + hinge_s(12544, slope, knee, per_token) - steps[12544]) / steps[12544]

    assert error_at_onset([1.0 / s for s in steps.values()]) < 0.5 * error_at_onset(None)


def test_a_flat_itl_has_no_context_cost_and_one_point_gives_the_old_line_through_the_origin():
    assert fit_hinge([(t, 0.0) for t in (4000, 8000, 16000)]) == (0.0, 0.0, 0.0)
    assert fit_hinge([(t, -1e-4) for t in (4000, 8000, 16000)]) == (0.0, 0.0, 0.0)  # faster with long contexts: noise
    assert fit_hinge([(12544, 2.5e-3)]) == pytest.approx((2.5e-3 / 12544, 0.0, 0.0), rel=1e-12)
    assert fit_hinge([]) == (0.0, 0.0, 0.0)


def test_padded_tokens_are_the_running_rows_times_the_longest():
    assert padded_tokens([1536.0] + [32.0] * 15) == 16 * 1536
    assert padded_tokens([]) == 0.0


def itl(mesh: MeshCost, prompts: list[int], output: int = 200) -> list[float]:
    cost = CostModel(prefill_s_per_token=1e-5, decode_s_per_step=2e-3, decode_s_per_seq=1e-4)
    requests = [TraceRequest(0.0, f"r{j}", "", p, output, tuple(range(1000 * j, 1000 * j + p // 16))) for j, p in enumerate(prompts)]
    return [outcome(r).itl_s for r in Cluster("round_robin", SimConfig(num_workers=1, cost=cost, mesh=mesh)).run(requests)]


def test_the_sims_decode_step_follows_the_hinge_in_streams_times_the_longest_context():
    mesh = MeshCost(decode_s_per_padded_token=SLOPE, decode_padded_knee_tokens=KNEE)
    base = 2e-3 + 1e-4 * 16
    # 16 streams of 1,536 prompt + 200 output tokens: mean context 1,636 each, 26,176 padded tokens
    assert itl(mesh, [1536] * 16) == pytest.approx([base + SLOPE * (16 * 1636 - KNEE)] * 16, rel=1e-9)
    # one long stream among short ones: every row padded to it, so the step costs the same
    assert itl(mesh, [1536] + [32] * 15) == pytest.approx([base + SLOPE * (16 * 1636 - KNEE)] * 16, rel=1e-9)
    # below the knee (4 x 1,636 = 6,544 padded: just past; 3 x 1,636 below) the context costs nothing
    assert itl(mesh, [1536] * 3) == pytest.approx([2e-3 + 3e-4] * 3, rel=1e-9)
    assert itl(mesh, [1536] * 4) == pytest.approx([2e-3 + 4e-4 + SLOPE * (4 * 1636 - KNEE)] * 4, rel=1e-9)
