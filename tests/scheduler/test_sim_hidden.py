"""Tokens before the first visible text (MeshCost.hidden_tokens): the client's TTFT comes that many
decode steps after the first token, the gateway's does not move; the fit's deciles of the probe's counts."""

from __future__ import annotations

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.meshcal import hidden_quantiles
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.report import outcome
from kvmesh.scheduler.sim.trace import TraceRequest

STEP, PER_SEQ = 0.01, 0.002
COST = CostModel(prefill_s_per_token=1e-5, decode_s_per_step=STEP, decode_s_per_seq=PER_SEQ)


def lone(hidden: tuple[int, ...], output_tokens: int = 20):
    request = TraceRequest(0.0, "r", "s", 100, output_tokens, ())
    return Cluster("round_robin", SimConfig(num_workers=1, cost=COST, mesh=MeshCost(hidden_tokens=hidden))).run([request])[0]


def test_the_clients_first_token_comes_the_hidden_tokens_decode_steps_after_the_first():
    plain, hidden = lone(()), lone((3,))
    assert hidden.first_token_s == plain.first_token_s and hidden.finish_s == plain.finish_s  # the engine's view
    assert outcome(hidden).ttft_s == pytest.approx(plain.ttft_s + 3 * (STEP + PER_SEQ))  # one stream: step(1) each
    assert outcome(plain).ttft_s == plain.ttft_s


def test_a_request_cannot_show_its_text_after_its_last_token():
    short = lone((50,), output_tokens=5)
    assert outcome(short).first_token_s == pytest.approx(short.finish_s)


def test_hidden_quantiles_are_nearest_rank_deciles():
    counts = [0] * 12 + [1] * 6 + [2, 3, 4, 9, 9, 9]  # 24 requests
    assert hidden_quantiles(counts) == (0, 0, 0, 0, 0, 1, 1, 2, 4, 9)
    assert hidden_quantiles([]) == ()


def test_the_cli_refuses_counts_that_are_not_token_counts(capsys):
    for bad in ("1,x", "-1"):
        with pytest.raises(SystemExit) as exit_:
            sim_main(["--hidden-tokens", bad, "--workers", "1"])
        assert exit_.value.code == 2
    assert "token counts" in capsys.readouterr().err
