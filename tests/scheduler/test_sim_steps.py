"""What the engine steps ran, the sim's and the mesh's (sim/steps.py): the decode workers'
/metrics counters read and differenced, and the simulator's own tally of its decode and prefill
steps, checked against runs whose steps are known."""

from __future__ import annotations

import math

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.steps import difference, parse_metrics, step_slowdown
from kvmesh.scheduler.sim.trace import TraceRequest

STEP, PER_SEQ, PER_TOKEN = 0.01, 0.002, 1e-5
COST = CostModel(prefill_s_per_token=PER_TOKEN, decode_s_per_step=STEP, decode_s_per_seq=PER_SEQ)

METRICS = """# HELP kvmesh_decode_model_steps_total engine steps that ran the model, by kind
# TYPE kvmesh_decode_model_steps_total counter
kvmesh_decode_model_steps_total{kind="decode"} 90.0
kvmesh_decode_model_steps_total{kind="prefill"} 10.0
kvmesh_decode_model_steps_created{kind="decode"} 1.7e+09
kvmesh_decode_step_decode_rows_total{kind="decode"} 360.0
kvmesh_decode_step_decode_rows_total{kind="prefill"} 20.0
kvmesh_decode_step_padded_kv_tokens_total{kind="decode"} 360000.0
kvmesh_decode_step_padded_kv_tokens_total{kind="prefill"} 30000.0
kvmesh_decode_engine_busy_seconds_total{kind="decode"} 0.9
kvmesh_decode_engine_busy_seconds_total{kind="prefill"} 0.5
kvmesh_decode_engine_steps_total 120.0
kvmesh_decode_engine_between_steps_seconds_total 0.3
"""


def test_the_metrics_text_gives_each_kinds_counters_and_two_readings_give_what_ran_between():
    before, after = parse_metrics(METRICS.replace("90.0", "40.0").replace("360.0", "160.0")), parse_metrics(METRICS)
    assert (after.decode.steps, after.decode.rows, after.decode.padded, after.decode.seconds) == (90, 360, 360000, 0.9)
    assert (after.prefill.steps, after.prefill.rows, after.prefill.padded, after.prefill.seconds) == (10, 20, 30000, 0.5)
    ran = difference(after, before)
    assert (ran.decode.steps, ran.decode.rows, ran.prefill.steps) == (50, 200, 0)
    row = after.row(span_s=2.0)
    assert row["rows"] == 4 and row["context"] == 1000 and row["step_ms"] == pytest.approx(10.0)
    assert row["decode_busy"] == pytest.approx(0.45) and row["prefill_busy"] == pytest.approx(0.25)
    assert row["between"] == pytest.approx(0.15) and ran.between == 0


def steps_of(trace: list[TraceRequest], stall: float = 1.0) -> tuple[dict[str, float], Cluster]:
    cluster = Cluster("round_robin", SimConfig(num_workers=1, cost=COST, mesh=MeshCost(prefill_stall=stall)))
    cluster.run(trace)
    return cluster.step_figures().row(cluster.now), cluster


def step_s(running: int) -> float:
    return STEP + running * PER_SEQ


def test_four_sequences_decoding_together_make_steps_of_four_rows_at_the_models_step_time():
    trace = [TraceRequest(0.0, f"r{i}", "", 64, 101, tuple(range(100 * i, 100 * i + 4))) for i in range(4)]
    row, cluster = steps_of(trace)
    # the first prompt's prefill step starts at once; the other three join the next one
    prefill_s = 4 * 64 * PER_TOKEN + step_s(1) + step_s(2)
    assert row["prefill_busy"] * cluster.now == pytest.approx(prefill_s)
    # all four run (the last three 1 step less long) at 4 rows a step, the context prompt + output / 2
    assert row["rows"] == pytest.approx(4, rel=0.01)
    assert row["step_ms"] == pytest.approx(1e3 * step_s(4), rel=0.01)
    assert row["context"] == pytest.approx(64 + 101 / 2)
    # the stall (1) takes the prefill steps out of the time with sequences running
    assert row["decode_busy"] * cluster.now == pytest.approx(cluster.now - prefill_s)


def test_a_longer_sequence_pads_every_row_while_it_runs():
    # a decodes alone, b (a longer context) runs beside it from 1 s for 40 tokens, a goes on alone
    trace = [TraceRequest(0.0, "a", "", 32, 400, tuple(range(2))), TraceRequest(1.0, "b", "", 480, 40, tuple(range(50, 80)))]
    row, cluster = steps_of(trace, stall=0.0)
    b_first = 1.0 + 480 * PER_TOKEN + step_s(2)  # b's prefill step (a riding along)
    pair = b_first + 39 * step_s(2) - 1.0        # the time both run
    solo_steps, pair_steps = (cluster.now - pair) / step_s(1), pair / step_s(2)
    assert row["rows"] == pytest.approx((solo_steps + 2 * pair_steps) / (solo_steps + pair_steps))
    # a pads to its own context alone, both rows pad to b's beside it
    a_ctx, b_ctx = 32 + 400 / 2, 480 + 40 / 2
    assert row["context"] == pytest.approx((solo_steps * a_ctx + pair_steps * 2 * b_ctx) / (solo_steps + 2 * pair_steps))
    assert row["step_ms"] == pytest.approx(1e3 * cluster.now / (solo_steps + pair_steps))


def test_stalled_time_is_not_counted_as_decode_steps():
    trace = [TraceRequest(0.0, f"r{i}", "", 512, 21, tuple(range(40 * i, 40 * i + 32))) for i in range(2)]
    stalled, _ = steps_of(trace, stall=1.0)
    free, _ = steps_of(trace, stall=0.0)
    assert stalled["decode_busy"] < free["decode_busy"]
    assert stalled["prefill_busy"] == pytest.approx(free["prefill_busy"], rel=0.05)


def test_each_request_keeps_its_wait_for_the_engine_and_its_prefill_as_the_engine_histograms_do():
    # two prompts at once on one idle worker: the first prefills at once, the second after it
    requests = [TraceRequest(0.0, f"r{i}", f"s{i}", 1000, 4, ()) for i in range(2)]
    cluster = Cluster("round_robin", SimConfig(num_workers=1, cost=COST))
    first, second = sorted(cluster.run(requests), key=lambda r: r.request.request_id)
    prefill = first.prefill_s
    assert first.queue_s == 0.0 and prefill == pytest.approx(1000 * PER_TOKEN + STEP + PER_SEQ)
    assert second.queue_s == pytest.approx(prefill) and second.prefill_s > 0
    assert first.first_token_s == pytest.approx(prefill) and second.first_token_s == pytest.approx(prefill + second.prefill_s)


def test_a_replays_own_decode_steps_give_the_hosts_slowdown_against_the_sims_costs():
    trace = [TraceRequest(0.0, f"r{i}", "", 64, 101, tuple(range(100 * i, 100 * i + 4))) for i in range(4)]
    row, _ = steps_of(trace)
    mesh = MeshCost(decode_s_per_kv_token=1e-6)  # no context cost in the run: the gauge charges it, so it reads fast
    assert step_slowdown(row, COST, MeshCost()) == pytest.approx(1.0, rel=0.01)
    assert step_slowdown(row, COST, mesh) < 1.0
    slow = dict(row, step_ms=1.5 * row["step_ms"])  # the same steps on a host 1.5x slower
    assert step_slowdown(slow, COST, MeshCost()) == pytest.approx(1.5, rel=0.01)
    assert math.isnan(step_slowdown({"rows": math.nan, "context": 1.0, "step_ms": 1.0}, COST, MeshCost()))
