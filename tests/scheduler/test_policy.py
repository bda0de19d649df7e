"""Exact choices of each policy on hand-built states (12-block prompts, block size 16)."""

import math

import pytest

from kvmesh.scheduler.policy import PolicyConfig, WorkerView, make_policy
from kvmesh.scheduler.policy_dualmap import DualMap
from kvmesh.scheduler.policy_kv import excess_requests, overlap_credit

from .helpers import hashes, state

P = hashes("p", 12)
TOKENS = 12 * 16 + 5


def w(worker_id: str, load: int = 0, cached: int = 0, backlog: float = 0.0, capacity: int = 8) -> WorkerView:
    return WorkerView(worker_id, load, capacity, cached, backlog)


def choose(policy_name: str, *workers: WorkerView, config: PolicyConfig | None = None) -> str:
    return make_policy(policy_name, config).choose(state(TOKENS, P, *workers)).worker_id


def test_round_robin_cycles_in_worker_order():
    policy = make_policy("round_robin")
    s = state(TOKENS, P, w("a"), w("b"), w("c"))
    assert [policy.choose(s).worker_id for _ in range(4)] == ["a", "b", "c", "a"]


def test_least_loaded_goes_by_utilization():
    assert choose("least_loaded", w("a", load=4), w("b", load=3, capacity=4), w("c", load=2)) == "c"


def test_prefix_affinity_takes_the_most_overlap_even_when_busy():
    # herding: the warm worker wins whatever its load
    assert choose("prefix_affinity", w("a", load=8, cached=10), w("b"), w("c")) == "a"


def test_prefix_affinity_breaks_ties_by_load():
    assert choose("prefix_affinity", w("a", load=5, cached=3), w("b", load=1, cached=3)) == "b"


def test_kv_aware_cold_start_takes_the_first_idle_worker():
    assert choose("kv_aware", w("a"), w("b"), w("c")) == "a"


def test_kv_aware_prefers_the_warm_worker_at_equal_load():
    # costs: a = 12 - 0 + 2*1 = 14, b = 12 - 10 + 2*1 = 4
    assert choose("kv_aware", w("a", load=1), w("b", load=1, cached=10)) == "b"


def test_kv_aware_overlap_credit_decays_on_a_hot_spot():
    # a: 8 requests, fair share 8 * 1/3 -> excess 16/3 -> credit 10*exp(-16/18) = 4.11; cost 12 - 4.11 + 2*8 = 23.9
    # b: cost 12 + 0 = 12 -> b wins although a holds 10 of the 12 blocks
    assert choose("kv_aware", w("a", load=8, cached=10), w("b"), w("c")) == "b"


def test_overlap_credit_decays_by_e_per_decay_requests_of_excess():
    assert overlap_credit(12, 0.0, 6.0) == 12.0
    assert overlap_credit(12, 6.0, 6.0) == pytest.approx(12 / math.e)
    assert overlap_credit(12, 12.0, 6.0) == pytest.approx(12 / math.e**2)
    assert overlap_credit(12, 50.0, 0.0) == 12.0  # no decay


def test_excess_requests_is_the_load_above_the_workers_fair_share():
    # mean utilization 1/8: a worker of 64 slots has a fair share of 8 requests, one of 8 slots of 1
    assert excess_requests(w("a", load=10, capacity=64), 0.125) == 2.0
    assert excess_requests(w("a", load=10, capacity=8), 0.125) == 9.0
    assert excess_requests(w("a", load=5, capacity=64), 0.125) == 0.0


@pytest.mark.parametrize("max_num_seqs", [8, 64])
def test_kv_aware_warm_worker_a_few_requests_hot_loses_at_any_max_num_seqs(max_num_seqs):
    # a: 5 requests, fair share 5/3 -> excess 10/3 requests -> credit 12*exp(-10/18) = 6.89; cost 12 - 6.89 + 2*5 = 15.1
    # b: 12 -> b. NOTE: with the excess counted in utilization a 64-slot worker kept 10.8 of its 12 blocks and won.
    workers = (w("a", load=5, cached=12, capacity=max_num_seqs), w("b", capacity=max_num_seqs), w("c", capacity=max_num_seqs))
    assert choose("kv_aware", *workers) == "b"


def test_kv_aware_warm_worker_one_request_above_its_share_still_wins():
    # a: excess 1 - 1/3 requests -> credit 12*exp(-2/18) = 10.74; cost 12 - 10.74 + 2 = 3.3 < b's 12
    workers = (w("a", load=1, cached=12, capacity=64), w("b", capacity=64), w("c", capacity=64))
    assert choose("kv_aware", *workers) == "a"


def test_kv_aware_without_decay_herds():
    config = PolicyConfig(kv_overlap_decay_requests=0.0, kv_decode_weight=0.5)
    # a: 12 - 10 + 0.5*8 = 6 ; b: 12
    assert choose("kv_aware", w("a", load=8, cached=10), w("b"), w("c"), config=config) == "a"


def test_kv_aware_counts_queued_prefill_work():
    # a's 0.1 s backlog is 62.5 blocks (1e-4 s/token * 16): 62.5 + 2 = 64.5 > b's 12
    assert choose("kv_aware", w("a", cached=10, backlog=0.1), w("b")) == "b"


def test_kv_aware_temperature_spreads_choices_reproducibly_by_seed():
    workers = (w("a", cached=1), w("b"), w("c"))

    def picks(seed: int) -> list[str]:
        policy = make_policy("kv_aware", PolicyConfig(kv_temperature=100.0, seed=seed))
        return [policy.choose(state(TOKENS, P, *workers)).worker_id for _ in range(50)]

    assert set(picks(7)) == {"a", "b", "c"}
    assert picks(3) == picks(3)


def test_dualmap_picks_the_better_of_its_two_hashed_candidates():
    policy = DualMap(PolicyConfig())
    workers = tuple(w(x) for x in "abcdefgh")
    first, second = policy.candidates(state(TOKENS, P, *workers))
    assert first.worker_id != second.worker_id
    loaded = tuple(w(x.worker_id, load=3) if x.worker_id == first.worker_id else x for x in workers)
    assert policy.choose(state(TOKENS, P, *loaded)).worker_id == second.worker_id
    # the same prefix maps to the same candidates every time
    assert [c.worker_id for c in policy.candidates(state(TOKENS, P, *workers))] == [first.worker_id, second.worker_id]


def test_dualmap_follows_the_warmest_worker_as_a_third_candidate():
    policy = DualMap(PolicyConfig())
    workers = [w(x) for x in "abcdefgh"]
    candidates = {c.worker_id for c in policy.candidates(state(TOKENS, P, *workers))}
    outsider = next(x.worker_id for x in workers if x.worker_id not in candidates)
    warm = tuple(w(x.worker_id, cached=12) if x.worker_id == outsider else x for x in workers)
    assert policy.choose(state(TOKENS, P, *warm)).worker_id == outsider


def test_dualmap_switches_to_load_when_the_candidates_miss_the_slo():
    policy = DualMap(PolicyConfig(dualmap_ttft_slo_s=1.0))
    workers = [w(x) for x in "abcd"]
    candidates = {c.worker_id for c in policy.candidates(state(TOKENS, P, *workers))}
    busy = tuple(w(x.worker_id, backlog=5.0) if x.worker_id in candidates else w(x.worker_id, backlog=0.2 if x.worker_id < "c" else 0.1) for x in workers)
    idle = min((x for x in busy if x.worker_id not in candidates), key=lambda x: x.backlog_s)
    assert policy.choose(state(TOKENS, P, *busy)).worker_id == idle.worker_id


def test_dualmap_moves_work_off_a_hot_spot():
    policy = DualMap(PolicyConfig(dualmap_hot_factor=2.0))
    workers = [w(x, load=1) for x in "abcdefgh"]
    first, second = policy.candidates(state(TOKENS, P, *workers))
    hot = tuple(
        w(x.worker_id, load=8, cached=12) if x.worker_id in (first.worker_id, second.worker_id) else x for x in workers
    )
    chosen = policy.choose(state(TOKENS, P, *hot)).worker_id
    assert chosen not in (first.worker_id, second.worker_id)


def test_unknown_policy_names_are_refused():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")
