"""`kvmesh sim` smoke tests on tiny traces (milliseconds each)."""

import json

import pytest

from kvmesh.scheduler.policy import POLICY_NAMES
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import SimConfig
from kvmesh.scheduler.sim.report import busiest_share, capacity, simulate
from kvmesh.scheduler.sim.trace import SyntheticConfig, read_jsonl, synthetic, write_jsonl

TINY = SyntheticConfig(duration_s=4.0, num_system_prompts=2, system_prompt_tokens=(64, 128), user_tokens=(16, 48),
                       output_tokens=(4, 8), think_time_s=0.5)


def test_synthetic_sessions_extend_their_previous_turn_and_share_system_prompts():
    trace = synthetic(TINY, rate=8.0)
    assert trace == sorted(trace, key=lambda r: r.arrival_s)
    by_session = {}
    for r in trace:
        by_session.setdefault(r.session_id, []).append(r)
    turns = next(t for t in by_session.values() if len(t) > 1)
    first, second = turns[0], turns[1]
    assert second.hash_ids[: len(first.hash_ids) + len(first.output_hash_ids)] == first.hash_ids + first.output_hash_ids
    assert len({r.hash_ids[0] for r in trace}) <= 2  # the first block is a system-prompt block


def test_the_same_seed_gives_the_same_sessions_at_any_rate():
    slow, fast = synthetic(TINY, 4.0), synthetic(TINY, 16.0)
    assert [r.hash_ids for r in slow if r.session_id == "s0"] == [r.hash_ids for r in fast if r.session_id == "s0"]


def test_trace_files_round_trip_and_mooncake_rows_are_read(tmp_path):
    trace = synthetic(TINY, 8.0)
    path = tmp_path / "trace.jsonl"
    write_jsonl(trace, path)
    assert [(r.request_id, r.hash_ids, r.output_hash_ids) for r in read_jsonl(path)] == [
        (r.request_id, r.hash_ids, r.output_hash_ids) for r in trace
    ]
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(json.dumps({"timestamp": 1500, "input_length": 40, "output_length": 3, "hash_ids": [7, 8]}) + "\n")
    (row,) = read_jsonl(mooncake)
    assert (row.arrival_s, row.prompt_tokens, row.hash_ids) == (1.5, 40, (7, 8))
    mooncake.write_text('{"t": 1, "prompt_tokens": 0}\n')
    with pytest.raises(ValueError, match="mooncake.jsonl:1"):
        read_jsonl(mooncake)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_serves_every_request(policy):
    trace = synthetic(TINY, 8.0)
    summary = simulate(policy, SimConfig(num_workers=4, num_prefill_workers=1), trace)
    assert summary.policy == policy and summary.ttft_p50_s > 0 and 0.0 <= summary.hit_rate < 1.0
    assert summary.imbalance >= 1.0


def test_prefix_aware_policies_hit_the_cache_more_than_round_robin():
    trace = synthetic(TINY, 8.0)
    config = SimConfig(num_workers=4)
    assert simulate("kv_aware", config, trace).hit_rate > simulate("round_robin", config, trace).hit_rate


def test_the_busiest_workers_share_is_a_fair_share_under_round_robin_and_more_where_prefixes_herd():
    trace = synthetic(SyntheticConfig(duration_s=6.0, num_system_prompts=2, turns_mean=2.0, seed=3), 8.0)
    config = SimConfig(num_workers=2)
    assert simulate("round_robin", config, trace).steps["busiest_share"] == pytest.approx(0.5, abs=1 / len(trace))
    # prefix_affinity sends every request of a system prompt where its first one went
    assert simulate("prefix_affinity", config, trace).steps["busiest_share"] > 0.55


def test_busiest_share_is_the_largest_count_over_the_total():
    assert busiest_share([881, 288]) == pytest.approx(881 / 1169)
    assert busiest_share([0, 0]) != busiest_share([0, 0])  # nan: nothing counted


def test_capacity_search_brackets_the_slo():
    fake = lambda rate: simulate_at(rate)  # noqa: E731
    rate, summary = capacity(fake, slo_s=1.0, start_rate=4.0, steps=3)
    assert 9.0 <= rate <= 10.0 and summary.ttft_p99_s <= 1.0


def simulate_at(rate: float):
    from kvmesh.scheduler.sim.report import RunSummary  # noqa: PLC0415

    ttft = 0.1 if rate <= 10.0 else 2.0  # a system whose capacity is 10 requests/s
    return RunSummary("x", 1, rate, ttft, ttft, rate, 0.0, 0.0, 1.0)


def test_sim_main_prints_a_row_per_policy(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_jsonl(synthetic(TINY, 8.0), path)
    assert sim_main(["--workers", "2", "--trace", str(path), "--policy", "round_robin,kv_aware", "--no-capacity", "--rate", "3"]) == 0
    out = capsys.readouterr().out
    assert "round_robin" in out and "kv_aware" in out and "ttft_p99" in out
