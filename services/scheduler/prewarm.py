"""Pre-warming a decode worker that joins the mesh: the hottest prefixes, up to a block budget.

`HotPrefixes` counts recent hits per block: every routed request adds one to each of its prompt's
blocks, and counts halve every `half_life_s`. Each block remembers its parent, so the picked blocks
can be rebuilt into prefixes root-first. A block's count is never below its children's (every hit
on a child is a hit on its parent at the same moment), so the hottest blocks form whole prefixes.

`Prewarmer` is what the router holds: it feeds `HotPrefixes`, queues decode workers that register
(new, or restarted), and for each one `plan()`s the hottest prefixes the KV store holds, up to
`budget_blocks`. While the worker fetches them it is *warming*; routing treats it as cold but
available (it is routed to like any other worker; only blocks it really holds count as cached).

Pure and synchronous.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PrewarmConfig:
    enabled: bool = True
    budget_blocks: int = 256        # most blocks one joining worker is asked to fetch
    half_life_s: float = 300.0      # hit counts halve this often ("recent")
    max_tracked_blocks: int = 65536  # beyond this the coldest are forgotten, down to half of it

    def __post_init__(self) -> None:
        if self.budget_blocks < 0 or self.half_life_s <= 0 or self.max_tracked_blocks < 1:
            raise ValueError("prewarm budget must be >= 0, half-life > 0 and max_tracked_blocks >= 1")


@dataclass(slots=True)
class _Heat:
    count: float
    at: float
    parent: bytes | None
    depth: int
    rank: float = 0.0  # log2(count) + at / half-life: orders blocks as their decayed counts do, at any one time


class HotPrefixes:
    """Decaying hit counts per block hash, with each block's parent."""

    def __init__(self, half_life_s: float = 300.0, max_blocks: int = 65536) -> None:
        self.half_life_s = half_life_s
        self.max_blocks = max_blocks
        self._blocks: dict[bytes, _Heat] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def observe(self, block_hashes: Sequence[bytes], now: float) -> None:
        """One hit on each block of a prompt (chained hashes, root first)."""
        parent: bytes | None = None
        for depth, block_hash in enumerate(block_hashes):
            heat = self._blocks.get(block_hash)
            if heat is None:
                heat = self._blocks[block_hash] = _Heat(1.0, now, parent, depth)
            else:
                heat.count, heat.at = self._decayed(heat, now) + 1.0, now
            heat.rank = math.log2(heat.count) + now / self.half_life_s
            parent = block_hash
        if len(self._blocks) > self.max_blocks:
            self._forget_coldest()

    def heat(self, block_hash: bytes, now: float) -> float:
        found = self._blocks.get(block_hash)
        return self._decayed(found, now) if found else 0.0

    def hottest(self, budget_blocks: int, now: float, available: Callable[[bytes], bool]) -> list[tuple[bytes, ...]]:
        """Up to `budget_blocks` of the hottest `available` blocks whose whole prefix is picked too,
        as prefixes (root first), hottest first; prefixes share their common blocks."""
        ranked = sorted(
            (h for h in self._blocks if available(h)),
            key=lambda h: (-self._decayed(self._blocks[h], now), self._blocks[h].depth, h),
        )
        picked: dict[bytes, None] = {}
        for block_hash in ranked:
            if len(picked) >= budget_blocks:
                break
            parent = self._blocks[block_hash].parent
            if parent is None or parent in picked:
                picked[block_hash] = None
        parents = {self._blocks[h].parent for h in picked}
        leaves = [h for h in picked if h not in parents]  # in heat order
        return [self._prefix(leaf) for leaf in leaves]

    def _prefix(self, leaf: bytes) -> tuple[bytes, ...]:
        chain: list[bytes] = []
        node: bytes | None = leaf
        while node is not None:
            chain.append(node)
            node = self._blocks[node].parent
        return tuple(reversed(chain))

    def _decayed(self, heat: _Heat, now: float) -> float:
        return heat.count * 0.5 ** (max(0.0, now - heat.at) / self.half_life_s)

    def _forget_coldest(self) -> None:
        """Keeps the hottest half. NOTE: it used to sort every block by its decayed count and keep 90%:
        with 65,536 tracked that held the scheduler's event loop 38 ms, every ~6,500 new blocks (every
        ~105 routes of all-new 1,000-token prompts). Ranks fixed at each hit order blocks as their
        decayed counts do, so a cut on a plain sort of floats picks the same blocks (a parent's rank is
        never below its child's: it is hit whenever the child is), and halving makes it 5x rarer."""
        keep = self.max_blocks // 2
        ranks = sorted(heat.rank for heat in self._blocks.values())
        if len(ranks) <= keep:
            return
        cut = ranks[len(ranks) - keep]
        kept = {h: heat for h, heat in self._blocks.items() if heat.rank > cut}
        # NOTE: blocks at the cut's rank, shallowest first, so a block never stays without its parent
        tied = sorted((heat.depth, h) for h, heat in self._blocks.items() if heat.rank == cut)
        kept.update((h, self._blocks[h]) for _, h in tied[: keep - len(kept)])
        self._blocks = kept


@dataclass(slots=True)
class Prewarmer:
    """Hot prefixes + decode workers waiting to be pre-warmed (`pending`) or warming now."""

    config: PrewarmConfig = field(default_factory=PrewarmConfig)
    hot: HotPrefixes = field(init=False)
    pending: list[str] = field(default_factory=list)
    warming: dict[str, float] = field(default_factory=dict)  # worker id → when its warm-up began

    def __post_init__(self) -> None:
        self.hot = HotPrefixes(self.config.half_life_s, self.config.max_tracked_blocks)

    def observe_route(self, block_hashes: Sequence[bytes], now: float) -> None:
        if self.config.enabled and block_hashes:
            self.hot.observe(block_hashes, now)

    def joined(self, worker_id: str) -> None:
        """A decode worker registered (new, or restarted): it is pre-warmed when `take()`n."""
        if self.config.enabled and worker_id not in self.pending:
            self.pending.append(worker_id)

    def take(self, now: float, available: Callable[[bytes], bool]) -> list[tuple[str, list[tuple[bytes, ...]]]]:
        """(worker id, prefixes to fetch) for each pending worker that has something to fetch; those
        count as warming from `now`. A worker with nothing to fetch is warm at once."""
        pending, self.pending = self.pending, []
        plans = []
        for worker_id in pending:
            prefixes = self.hot.hottest(self.config.budget_blocks, now, available)
            if prefixes:
                self.warming[worker_id] = now
                plans.append((worker_id, prefixes))
        return plans

    def done(self, worker_id: str, now: float) -> float | None:
        """The worker's warm-up ended (fetched, failed or timed out); seconds it took, None if unknown."""
        began = self.warming.pop(worker_id, None)
        return None if began is None else now - began

    def forget(self, worker_id: str) -> None:
        """The worker left the mesh."""
        self.warming.pop(worker_id, None)
        if worker_id in self.pending:
            self.pending.remove(worker_id)

    def is_warming(self, worker_id: str) -> bool:
        return worker_id in self.warming


def count_blocks(prefixes: Sequence[Sequence[bytes]]) -> int:
    """Distinct blocks in `prefixes` (they share their common leading blocks)."""
    return len({h for prefix in prefixes for h in prefix})
