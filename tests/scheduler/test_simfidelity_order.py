"""bench/simfidelity.py's policy-order check: a pair the sim calls holds only when every real run
orders it alike; real runs that disagree with each other are a split, not a pass."""

from __future__ import annotations

from .benchmodule import bench_module


def order_verdicts():
    return bench_module("simfidelity").order_verdicts


SIM = {"round_robin": [0.117], "prefix_affinity": [0.387], "kv_aware": [0.100]}


def test_every_called_pair_holding_in_every_run_is_the_order_holding():
    lines = order_verdicts()(SIM, {"round_robin": [0.12, 0.13], "prefix_affinity": [0.70, 0.50], "kv_aware": [0.10, 0.11]})
    assert lines[0].startswith("sim order: kv_aware < round_robin < prefix_affinity; real order (mean of runs): "
                               "kv_aware < round_robin < prefix_affinity; same")
    assert sum("holds" in line for line in lines[1:-1]) == 3
    assert lines[-1] == "pairs the sim calls that hold in every real run: 3 of 3 (the order holds)"


def test_runs_that_disagree_are_a_split_and_a_pair_against_the_sim_does_not_hold():
    lines = order_verdicts()(SIM, {"round_robin": [0.108, 0.20], "prefix_affinity": [0.05, 0.06], "kv_aware": [0.132, 0.11]})
    by_pair = {line.split(":")[0].strip(): line for line in lines[1:-1]}
    assert by_pair["round_robin vs kv_aware"].endswith("split: the real runs disagree")
    assert by_pair["round_robin vs prefix_affinity"].endswith("does NOT hold")
    assert by_pair["prefix_affinity vs kv_aware"].endswith("does NOT hold")
    assert lines[-1] == "pairs the sim calls that hold in every real run: 0 of 3"
    assert "DIFFERENT" in lines[0]


def test_a_tie_in_the_sim_is_not_called_whatever_the_real_runs_say():
    sim = {"round_robin": [0.117], "kv_aware": [0.112]}
    lines = order_verdicts()(sim, {"round_robin": [0.108, 0.109], "kv_aware": [0.132, 0.252]})
    assert lines[1] == "  round_robin vs kv_aware: within 10% in the sim (a tie); real 0.108 vs 0.132, 0.109 vs 0.252"
    assert lines[-1] == "pairs the sim calls that hold in every real run: 0 of 0 (the sim calls no pair)"


def test_a_pair_the_sims_draws_order_both_ways_is_not_called():
    # run BZ: prefix_affinity's placement flipped with 5% of host time, p90 1.632 / 0.062 / 11.3 s
    sim = {"round_robin": [0.055, 0.058, 0.061], "prefix_affinity": [1.632, 0.050, 11.3]}
    lines = order_verdicts()(sim, {"round_robin": [0.056, 0.050], "prefix_affinity": [0.063, 0.057]})
    assert lines[1].startswith("  round_robin vs prefix_affinity: the sim's draws disagree (sim 0.055 vs 1.632, "
                               "0.058 vs 0.050, 0.061 vs 11.300), not called")
    assert lines[-1] == "pairs the sim calls that hold in every real run: 0 of 0 (the sim calls no pair)"


def test_the_sim_orders_by_the_median_of_its_draws():
    sim = {"round_robin": [0.055, 0.058, 0.061], "prefix_affinity": [1.632, 0.062, 11.3]}
    lines = order_verdicts()(sim, {"round_robin": [0.056, 0.050], "prefix_affinity": [0.063, 0.057]})
    assert lines[0].startswith("sim order: round_robin < prefix_affinity; ")
    assert lines[1].endswith(": holds")
    assert lines[-1] == "pairs the sim calls that hold in every real run: 1 of 1 (the order holds)"
