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
