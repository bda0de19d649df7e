"""hostspeed.py: the sim's costs scaled to the host's speed now (a shared machine drifts between a
calibration and a replay)."""

from __future__ import annotations

import dataclasses

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import SimConfig
from kvmesh.scheduler.sim.hostspeed import MESH_TIME_TERMS, Speed, drift, pooled, scaled, speed_ratio, steadiest
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.trace import SyntheticConfig, scale_rate, synthetic

from .test_sim_calibrate import sim_outcomes

COST = CostModel(prefill_s_per_token=2.4e-4, decode_s_per_step=2.6e-3, decode_s_per_seq=1.0e-4)
MESH = MeshCost(attention_s_per_pair=1.1e-7, request_overhead_s=0.031, request_busy_s=0.004, token_overhead_s=4.0e-4,
                decode_s_per_padded_token=5.0e-7, decode_padded_knee_tokens=6000.0, hit_s_per_token=1.5e-5,
                handback_s_per_turn=1e-3, handback_s_per_token=6e-6, prefill_stall=0.8, prefill_share=0.05,
                prefill_s_per_stream=4.0e-4, host_parallelism=1.5, noise=(0.9, 1.0, 1.2), pause_rate_hz=1.0, pause_s=0.05,
                admission_limit=64)


def test_scaled_multiplies_every_time_term_and_leaves_the_dimensionless_ones():
    cost, mesh = scaled(COST, MESH, 1.5)
    assert (cost.prefill_s_per_token, cost.decode_s_per_step, cost.decode_s_per_seq) == pytest.approx(
        (3.6e-4, 3.9e-3, 1.5e-4), rel=1e-12)
    for name in MESH_TIME_TERMS:
        before = getattr(MESH, name)
        assert getattr(mesh, name) == (None if before is None else pytest.approx(1.5 * before, rel=1e-12)), name
    same = ("decode_padded_knee_tokens", "prefill_stall", "prefill_share", "host_parallelism", "noise", "hidden_tokens",
            "pause_rate_hz", "admission_limit", "admission_timeout_s", "admission_queue_factor", "stream_interval",
            "stream_interval_from")
    assert {n: getattr(mesh, n) for n in same} == {n: getattr(MESH, n) for n in same}
    assert {f.name for f in dataclasses.fields(MeshCost)} == set(MESH_TIME_TERMS) | set(same)  # every term is placed
    with pytest.raises(ValueError):
        scaled(COST, MESH, 0.0)


def test_on_a_host_twice_as_slow_a_trace_at_half_the_rate_takes_exactly_twice_as_long():
    # the sim's clock scales with its costs: every TTFT and ITL doubles (one worker, no routing choice,
    # no noise or pauses: those are per request and per wall-clock second)
    mesh = dataclasses.replace(MESH, noise=(), pause_rate_hz=0.0, host_parallelism=0.0)
    trace = synthetic(SyntheticConfig(duration_s=6.0, num_system_prompts=2, seed=3), 4.0)
    config = SimConfig(num_workers=1, cost=COST, mesh=mesh)
    slow_cost, slow_mesh = scaled(COST, mesh, 2.0)
    fast = sim_outcomes(config, trace)
    slow = sim_outcomes(dataclasses.replace(config, cost=slow_cost, mesh=slow_mesh), scale_rate(trace, 0.5))
    assert len(fast) == len(slow) > 10
    assert [o.ttft_s * 2 for o in fast] == pytest.approx([o.ttft_s for o in slow], rel=1e-9)
    assert [o.finish_s * 2 for o in fast] == pytest.approx([o.finish_s for o in slow], rel=1e-9)


def test_the_ratio_is_the_geometric_mean_of_the_ttft_and_itl_ratios():
    reference = Speed(ttft_s=0.040, itl_s=0.002)
    assert speed_ratio(Speed(0.080, 0.002), reference) == pytest.approx(2 ** 0.5)
    assert speed_ratio(Speed(0.060, 0.003), reference) == pytest.approx(1.5)
    assert speed_ratio(reference, reference) == 1.0
    assert pooled([Speed(0.04, 0.003), Speed(0.05, 0.001), Speed(0.09, 0.002)]) == Speed(0.05, 0.002)
    with pytest.raises(ValueError):
        speed_ratio(Speed(0.0, 0.002), reference)


def test_kvmesh_sim_takes_a_time_scale_and_refuses_a_bad_one(capsys):
    base = ["--workers", "1", "--policy", "round_robin", "--no-capacity", "--rate", "2", "--duration-s", "4",
            "--warmup-s", "1", "--system-prompts", "2", "--prefill-s-per-token", "2e-4"]

    def ttft_p50(extra):
        assert sim_main([*base, *extra]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("round_robin"))
        return float(row.split()[3])

    assert ttft_p50(["--time-scale", "3"]) > 2.5 * ttft_p50([])
    with pytest.raises(SystemExit, match="time-scale"):
        sim_main([*base, "--time-scale", "0"])


def test_drift_is_how_far_the_speed_moved_either_way():
    start = Speed(ttft_s=0.0911, itl_s=0.00294)
    end = Speed(ttft_s=0.0498, itl_s=0.00250)  # run AU's calibration: the host got faster under it
    assert drift(start, end) == pytest.approx(1 / 0.6819, rel=1e-3)
    assert drift(end, start) == pytest.approx(drift(start, end))
    assert drift(start, start) == 1.0


def test_the_first_calibration_within_the_tolerance_is_kept_else_the_steadiest():
    assert steadiest([1.47, 1.08, 1.02], 0.15) == 1
    assert steadiest([1.47, 1.30, 1.21], 0.15) == 2
    assert steadiest([1.10], 0.15) == 0
