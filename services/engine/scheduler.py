"""Unified continuous-batching scheduler (pure Python, torch-free).

Each step every scheduled sequence gets `num_new_tokens`: 1 for decode, a chunk for prefill,
all under one `max_num_batched_tokens` budget. Both queues are ordered by (priority, arrival):
lower priority values run first (vLLM's semantics), equal ones in arrival order. Running
sequences go first; when blocks run out the last running sequence (the lowest priority, latest
arrival) is preempted: its blocks are freed and it is recomputed later. A waiting sequence of
better priority than the last running one that does not fit preempts running sequences of worse
priority until it does. Otherwise waiting sequences are admitted only in steps without
preemption, reusing prefix-cache hits and KV handed in from elsewhere (`computed_kv`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

from kvmesh.engine.block_manager import BlockManager
from kvmesh.engine.sequence import Sequence, SequenceStatus

HashFn = Callable[[bytes | None, Seq[int]], bytes]


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # num_computed_tokens before this step
    num_new_tokens: int


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    kv_imports: list[tuple[Sequence, int, int]] = field(default_factory=list)  # (seq, start, end) from computed_kv
    prefilled: list[Sequence] = field(default_factory=list)  # prefill_only sequences with nothing left to compute
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(slots=True)
class SchedulerCounters:
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, hash_fn: HashFn, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        self.bm = block_manager
        self.block_size = block_manager.block_size
        self.hash_fn = hash_fn
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()
        self._arrivals = 0

    def add(self, seq: Sequence) -> None:
        self._arrivals += 1
        seq.arrival = self._arrivals
        bisect.insort(self.waiting, seq, key=_order)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._preempt_for_priority(out)
        made_room = len(out.preempted)
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.target_len - seq.num_computed_tokens, budget)
            need = self._blocks_for(seq.num_computed_tokens + n) - len(seq.block_table)
            while need > self.bm.num_free_blocks and self.running[-1] is not seq:
                self._preempt(self.running.pop(), out)
            if need > self.bm.num_free_blocks:
                self._preempt(self.running.pop(), out)
                break
            seq.block_table.extend(self.bm.allocate(max(need, 0)))
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
            i += 1
        if len(out.preempted) == made_room:
            self._admit(out, budget)
        return out

    def _preempt_for_priority(self, out: SchedulerOutput) -> None:
        """Preempt running sequences of worse priority than the first waiting one until it fits."""
        if not self.waiting:
            return
        head = self.waiting[0]
        while self.running and self.running[-1].params.priority > head.params.priority and not self._fits(head):
            self._preempt(self.running.pop(), out)

    def _fits(self, seq: Sequence) -> bool:
        if len(self.running) >= self.max_num_seqs:
            return False
        self.update_hashes(seq)
        hits = self.bm.match_prefix(seq.block_hashes[: seq.max_cache_hit_tokens // self.block_size], seq.token_ids)
        need = self._blocks_for(seq.target_len) - len(hits)
        return need + self.bm.num_free_among(hits) <= self.bm.num_free_blocks

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.update_hashes(seq)
            # NOTE: prompt logprobs need the logits of every prompt token, so no cache hits (as vLLM).
            max_hit_blocks = 0 if seq.params.prompt_logprobs is not None else seq.max_cache_hit_tokens // self.block_size
            hits = self.bm.match_prefix(seq.block_hashes[:max_hit_blocks], seq.token_ids)
            hit_tokens = len(hits) * self.block_size
            computed = max(hit_tokens, seq.computed_kv_len)
            n = min(seq.target_len - computed, budget)
            need = self._blocks_for(computed + n) - len(hits)
            if need + self.bm.num_free_among(hits) > self.bm.num_free_blocks:
                break
            self.waiting.popleft()
            self.bm.take(hits)
            seq.block_table = hits + self.bm.allocate(need)
            seq.num_committed_blocks = len(hits)
            seq.num_computed_tokens = computed
            if not seq.admitted_once:
                seq.admitted_once = True
                seq.num_cached_tokens = hit_tokens
                self.counters.prefix_query_tokens += seq.num_prompt_tokens
                self.counters.prefix_hit_tokens += hit_tokens
            if seq.computed_kv_len > hit_tokens:
                out.kv_imports.append((seq, hit_tokens, seq.computed_kv_len))  # the engine lets it go once written
            else:
                seq.computed_kv = None  # NOTE: the prefix cache holds all of it; never keep it for the request's life
            if n == 0:
                seq.status = SequenceStatus.PREFILLED
                out.prefilled.append(seq)
                continue
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=_order)
            out.scheduled.append(ScheduledSeq(seq, computed, n))
            budget -= n

    def update_hashes(self, seq: Sequence) -> None:
        """Extend `seq.block_hashes` to cover every full block of its tokens."""
        bs = self.block_size
        while len(seq.block_hashes) < seq.num_tokens // bs:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(self.hash_fn(parent, seq.token_ids[i * bs : (i + 1) * bs]))

    def commit_blocks(self, seq: Sequence) -> None:
        """Register every full block whose KV is computed in the prefix cache."""
        self.update_hashes(seq)
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_hashes), len(seq.block_table))
        for i in range(seq.num_committed_blocks, full):
            parent = seq.block_hashes[i - 1] if i else None
            self.bm.cache_block(seq.block_table[i], seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs], parent)
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)

    def finish(self, seq: Sequence, reason: str, keep_blocks: bool = False) -> None:
        """Take `seq` out of the queues; free its blocks unless `keep_blocks` (prefill_only)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.finish_reason = reason
        seq.status = SequenceStatus.PREFILLED if keep_blocks else SequenceStatus.FINISHED
        if not keep_blocks:
            self.free_blocks(seq)

    def free_blocks(self, seq: Sequence) -> None:
        self.bm.free(seq.block_table)
        seq.block_table = []

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.free_blocks(seq)
        seq.num_computed_tokens = 0
        seq.num_committed_blocks = 0
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_order)
        self.counters.num_preemptions += 1
        out.preempted.append(seq)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def _order(seq: Sequence) -> tuple[int, int]:
    return (seq.params.priority, seq.arrival)
