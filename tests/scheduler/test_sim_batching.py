"""The simulator's prefill steps: prompts that arrive while a worker's step runs are prefilled
together in its next one, up to the token budget, as the engine's scheduler admits them."""

from __future__ import annotations

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import SimConfig
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.trace import TraceRequest

from .test_sim_calibrate import sim_outcomes

STEP = 0.01          # the decode ride-along of every prefill step (no per-sequence cost)
PER_TOKEN = 1e-4


def request(at: float, name: str, tokens: int, base: int) -> TraceRequest:
    return TraceRequest(at, name, "", tokens, 2, tuple(range(base, base + tokens // 16)))


def first_tokens(mesh: MeshCost = MeshCost()) -> dict[str, float]:
    config = SimConfig(num_workers=1, cost=CostModel(prefill_s_per_token=PER_TOKEN, decode_s_per_step=STEP, decode_s_per_seq=0.0),
                       mesh=mesh)
    trace = [request(0.0, "a", 1000, 0), request(0.01, "b", 96, 10_000), request(0.02, "c", 96, 20_000),
             request(0.03, "d", 2000, 30_000), request(0.04, "e", 96, 40_000)]
    names = {r.arrival_s: r.request_id for r in trace}  # NOTE: outcomes come in the order requests finish
    return {names[o.arrival_s]: o.first_token_s for o in sim_outcomes(config, trace)}


def test_prompts_waiting_for_a_step_share_the_next_one_and_its_ride_along():
    t = first_tokens()
    a_end = 1000 * PER_TOKEN + STEP
    assert t["a"] == pytest.approx(a_end)
    # b opens the next step (its work and the ride-along), c joins it (its work only): both get their
    # first token at its end, c's work included
    assert t["b"] == pytest.approx(a_end + STEP + 2 * 96 * PER_TOKEN) == t["c"]
    # d does not fit the step's 2,048-token budget beside them: a step of its own after it; e does not
    # fit beside d either: the step after that
    assert t["d"] == pytest.approx(t["c"] + 2000 * PER_TOKEN + STEP)
    assert t["e"] == pytest.approx(t["d"] + 96 * PER_TOKEN + STEP)


def test_a_joining_prompt_pays_no_per_stream_cost():
    mesh = MeshCost(prefill_s_per_stream=0.005)
    t = first_tokens(mesh)
    a_end = 1000 * PER_TOKEN + STEP
    # b's step: the ride-along and a per-stream cost beside a (one stream), once; c adds its work only
    assert t["b"] == pytest.approx(a_end + STEP + 0.005 + 2 * 96 * PER_TOKEN) == t["c"]
