"""Scheduler: token budget, chunked prefill, admission limits, preemption order (pure Python)."""

from __future__ import annotations

from kvmesh.engine.block_manager import BlockManager
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import Scheduler
from kvmesh.engine.sequence import Sequence, SequenceStatus
from kvmesh.runtime.blockhash import BlockHasher

HASHER = BlockHasher("test", "float32", 4)


def make(num_blocks: int = 16, max_num_seqs: int = 8, budget: int = 16) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, 4), HASHER.extend, max_num_seqs, budget)


def seq(rid: str, n: int, **kw) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), n, SamplingParams(), **kw)


def advance(s: Scheduler) -> list[tuple[str, int, int]]:
    """Schedule once and pretend the forward ran (no sampling)."""
    out = s.schedule()
    for item in out.scheduled:
        item.seq.num_computed_tokens += item.num_new_tokens
        s.commit_blocks(item.seq)
    return [(i.seq.request_id, i.start, i.num_new_tokens) for i in out.scheduled]


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    s = make(budget=8)
    a = seq("a", 20)
    s.add(a)
    assert advance(s) == [("a", 0, 8)]
    assert a.block_table == [0, 1]
    assert advance(s) == [("a", 8, 8)]
    assert advance(s) == [("a", 16, 4)]
    assert a.block_table == [0, 1, 2, 3, 4] and a.num_committed_blocks == 5


def test_budget_is_shared_and_running_goes_first() -> None:
    s = make(budget=10)
    a, b = seq("a", 6), seq("b", 9)
    s.add(a)
    s.add(b)
    assert advance(s) == [("a", 0, 6), ("b", 0, 4)]
    a.token_ids.append(99)  # a sampled a token: now one decode token
    assert advance(s) == [("a", 6, 1), ("b", 4, 5)]


def test_max_num_seqs_limits_admission() -> None:
    s = make(max_num_seqs=2)
    for rid in "abc":
        s.add(seq(rid, 3))
    assert [r for r, _, _ in advance(s)] == ["a", "b"]
    assert [q.request_id for q in s.waiting] == ["c"]


def test_preemption_frees_the_newest_sequence_and_requeues_it_first() -> None:
    s = make(num_blocks=4, budget=64)
    a, b = seq("a", 8), seq("b", 7)
    s.add(a)
    s.add(b)
    advance(s)  # a: blocks 0,1; b: blocks 2,3
    a.token_ids.append(5)  # a needs a third block, none is free
    b.token_ids.append(5)
    out = s.schedule()
    assert [q.request_id for q in out.preempted] == ["b"]
    assert [(i.seq.request_id, i.start, i.num_new_tokens) for i in out.scheduled] == [("a", 8, 1)]
    assert (b.status, b.num_computed_tokens, b.block_table) == (SequenceStatus.WAITING, 0, [])
    assert list(s.waiting) == [b] and s.counters.num_preemptions == 1


def test_prefix_hit_skips_cached_blocks_but_keeps_last_token() -> None:
    s = make()
    a = seq("a", 8)
    s.add(a)
    advance(s)
    first_block = a.block_table[0]
    s.finish(a, "stop")
    b = seq("b", 8)  # same 8 tokens: 2 full cached blocks, but the last token must be recomputed
    s.add(b)
    assert advance(s) == [("b", 4, 4)]
    assert b.num_cached_tokens == 4 and b.block_table[0] == first_block
    assert s.counters.prefix_hit_tokens == 4


def test_prefill_only_with_all_kv_supplied_finishes_at_admission() -> None:
    s = make()

    class FakeKV:
        shape = (2, 1, 5, 1, 1)

    p = seq("p", 6, prefill_only=True, computed_kv=FakeKV())
    s.add(p)
    out = s.schedule()
    assert out.prefilled == [p] and out.scheduled == []
    assert out.kv_imports == [(p, 0, 5)]
    assert p.block_table == [0, 1] and p.status == SequenceStatus.PREFILLED


def pseq(rid: str, n: int, priority: int) -> Sequence:
    """A sequence whose tokens share no block with another's (its own first token)."""
    return Sequence(rid, [1000 + sum(map(ord, rid))] + list(range(2, n + 1)), n, SamplingParams(priority=priority))


def test_waiting_queue_is_ordered_by_priority_then_arrival() -> None:
    s = make(max_num_seqs=1, budget=64)
    for rid, prio in (("late_low", 3), ("normal", 0), ("high", -2), ("normal2", 0)):
        s.add(pseq(rid, 4, prio))
    assert [q.request_id for q in s.waiting] == ["high", "normal", "normal2", "late_low"]


def test_high_priority_arrival_preempts_lower_priority_when_blocks_run_out() -> None:
    s = make(num_blocks=4, budget=64)  # 4 blocks of 4 tokens
    low = pseq("low", 12, priority=5)
    s.add(low)
    assert advance(s) == [("low", 0, 12)]
    high = pseq("high", 8, priority=0)
    s.add(high)
    out = s.schedule()
    assert [q.request_id for q in out.preempted] == ["low"] and low.status is SequenceStatus.WAITING
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("high", 8)]
    assert s.counters.num_preemptions == 1


def test_equal_or_better_priority_running_is_not_preempted_for_an_arrival() -> None:
    s = make(num_blocks=4, budget=64)
    first = pseq("first", 12, priority=0)
    s.add(first)
    advance(s)
    s.add(pseq("second", 8, priority=0))
    out = s.schedule()
    assert out.preempted == [] and [i.seq.request_id for i in out.scheduled] == ["first"]


def test_running_preemption_takes_the_lowest_priority_first() -> None:
    s = make(num_blocks=6, budget=64)
    low, high = pseq("low", 8, priority=1), pseq("high", 8, priority=0)
    s.add(low)
    s.add(high)
    advance(s)  # both prefilled: 2 blocks each, 2 free
    for q in (low, high):
        q.token_ids.extend([7] * 8)  # each needs 2 more blocks next step: only one fits
    out = s.schedule()
    assert [q.request_id for q in out.preempted] == ["low"]
    assert [i.seq.request_id for i in out.scheduled] == ["high"]
