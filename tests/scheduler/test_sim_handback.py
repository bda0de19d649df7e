"""A finished turn's KV hand-back to the store (handback.py): its cost, the simulated worker held
busy by it, and the calibration giving its terms back from timings the formula made."""

import dataclasses

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.handback import fit_handback, handback_s
from kvmesh.scheduler.sim.meshcal import fit
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.trace import TraceRequest
from tests.scheduler.test_sim_calibrate import TRUE, formula_samples

PER_TURN, PER_TOKEN = 0.004, 6.0e-6


def test_a_turn_costs_its_fixed_part_plus_its_tokens():
    assert handback_s(1088, PER_TURN, PER_TOKEN) == pytest.approx(0.004 + 1088 * 6.0e-6)
    assert handback_s(1088, 0.0, 0.0) == 0.0
    assert MeshCost(handback_s_per_turn=PER_TURN, handback_s_per_token=PER_TOKEN).handback_s(128) == handback_s(128, PER_TURN, PER_TOKEN)


def run(requests: list[TraceRequest], per_turn: float = 0.0, per_token: float = 0.0) -> dict[str, tuple[float, float]]:
    """(first token, finish) per request id on one simulated worker."""
    mesh = MeshCost(handback_s_per_turn=per_turn, handback_s_per_token=per_token)
    results = Cluster("round_robin", SimConfig(num_workers=1, cost=CostModel(), mesh=mesh)).run(requests)
    return {r.request.request_id: (r.first_token_s, r.finish_s) for r in results}


def test_a_request_arriving_as_a_turn_ends_waits_for_its_hand_back():
    turn = TraceRequest(0.0, "turn", "", 1024, 8, tuple(range(64)))
    ended = run([turn])["turn"][1]
    after = TraceRequest(ended + 1e-9, "after", "", 64, 4, (9000, 9001, 9002, 9003))
    quiet, busy = run([turn, after])["after"], run([turn, after], PER_TURN, PER_TOKEN)["after"]
    held = handback_s(1024, PER_TURN, PER_TOKEN) - 1e-9  # its 64 full blocks (8 output tokens fill none)
    assert busy[0] - quiet[0] == pytest.approx(held, rel=1e-6)
    assert busy[1] - quiet[1] == pytest.approx(held, rel=1e-6)


def test_the_streams_running_when_a_turn_ends_stop_for_its_hand_back():
    long = TraceRequest(0.0, "long", "", 64, 200, (5, 6, 7, 8))
    short = TraceRequest(0.05, "short", "", 64, 4, (1, 2, 3, 4))  # starts and ends while the long one decodes
    quiet, busy = run([short, long]), run([short, long], PER_TURN, PER_TOKEN)
    assert busy["short"] == quiet["short"]  # its own hand-back comes after it
    assert busy["long"][1] - quiet["long"][1] == pytest.approx(handback_s(64, PER_TURN, PER_TOKEN), rel=1e-9)


def test_a_turn_hands_back_only_the_blocks_the_store_lacks():
    # the second turn repeats the first's 64 blocks and adds 16: the store gets those 16 only,
    # as decode/handback.py looks every block up first; a repeat of it adds none
    first = TraceRequest(0.0, "first", "", 1024, 8, tuple(range(64)))
    second = TraceRequest(5.0, "second", "", 1280, 8, tuple(range(80)))
    again = TraceRequest(10.0, "again", "", 1280, 8, tuple(range(80)))
    after = {name: TraceRequest(t, name, "", 64, 4, tuple(range(9000 + 10 * i, 9004 + 10 * i)))
             for i, (name, t) in enumerate((("a1", 0.0), ("a2", 5.0), ("a3", 10.0)))}
    ends = run([first, second, again])
    probes = [dataclasses.replace(after[n], arrival_s=ends[turn][1] + 1e-9) for n, turn in zip(after, ("first", "second", "again"))]
    quiet = run([first, second, again, *probes])
    busy = run([first, second, again, *probes], PER_TURN, PER_TOKEN)
    waited = [busy[p.request_id][0] - quiet[p.request_id][0] + 1e-9 for p in probes]
    assert waited == pytest.approx([handback_s(1024, PER_TURN, PER_TOKEN), handback_s(256, PER_TURN, PER_TOKEN),
                                    handback_s(0, PER_TURN, PER_TOKEN)], rel=1e-6)


def test_the_fit_gives_back_both_terms_from_two_turn_lengths():
    points = [(k, t, k * handback_s(t, PER_TURN, PER_TOKEN)) for k, t in ((16, 128), (16, 1088), (8, 1088))]
    assert fit_handback(points) == pytest.approx((PER_TURN, PER_TOKEN), rel=1e-9)
    one_length = [(16, 1088, 16 * 0.01)]
    assert fit_handback(one_length) == pytest.approx((0.0, 0.01 / 1088), rel=1e-9)
    assert fit_handback([]) == (0.0, 0.0)
    assert fit_handback([(16, 128, -0.002), (16, 1088, -0.001)]) == (0.0, 0.0)  # noise below a quiet worker: none


def test_the_calibration_fits_the_hand_back_from_timings_the_formula_made():
    cal = dataclasses.replace(TRUE, handback_s_per_turn=PER_TURN, handback_s_per_token=PER_TOKEN)
    samples = formula_samples(cal)
    samples.handback = [(16, t, 16 * handback_s(t, PER_TURN, PER_TOKEN)) for t in (128, 1088) for _ in range(3)]
    got = fit(samples, engine_decode_s_per_seq=cal.decode_s_per_seq)
    assert (got.handback_s_per_turn, got.handback_s_per_token) == pytest.approx((PER_TURN, PER_TOKEN), rel=1e-9)
    assert got.decode_s_per_step == pytest.approx(TRUE.decode_s_per_step, rel=1e-9)  # the other terms as before
    assert "--handback-s-per-turn 0.004 --handback-s-per-token 6e-06" in " ".join(got.sim_flags())
