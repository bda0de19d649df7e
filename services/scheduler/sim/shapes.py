"""The token counts a worker's engine ran its steps at lately, for the simulator's new-shape cost
(MeshCost.prefill_s_new_shape; cluster.py charges it).

On CPU the engine's oneDNN kernels are built for, and cached per, input shape: a step whose number
of new tokens (its prompts' uncached tokens plus one per decode row riding along) the engine has
not run lately builds its kernels first. Lone requests of 704 cached + 200 new tokens on tiny took
17.7 ms with 200 new every time and 21.8 ms with a new count each time. The cache holds
`cpu_kernel_cache_entries` kernels (256, services/worker/settings.py), least recently used out.

A sim run starts every worker's cache as a first pass of the same trace left it (SimConfig
.warm_kernel_caches, `kvmesh sim --cold-kernel-caches` to start empty): a mesh serving a workload
for a while has its counts cached, and the fidelity bench's real replays always come after the same
trace's lengths were sent (the capacity search; a policy run's warm-up replay). On run AV's saved
probes a cold sim put the 1-worker capacity at 11.0 req/s against a real 13.75 and its TTFT p50 17%
over the real one at 50% load; warm, 11.5 and +7% (and +3% / +3% at 80%, where it was +22% / +19%).

NOTE: the sim keeps the counts of prefill steps only. A decode step has one row per running
sequence, at most max_num_seqs (64) counts that every busy worker runs all the time, so they stay
cached and are not tracked; and each count takes one entry per distinct linear weight shape in the
engine's caches, so they hold fewer counts than entries (`--kernel-cache-counts` sets the sim's).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

KERNEL_CACHE_COUNTS = 256  # the sim's default: as many counts as the engine's cache has entries (see NOTE above)
Undo = tuple[int, "int | None"]  # a step's count that was new, and the count its run evicted (None: none)


@dataclass(slots=True)
class ShapeCache:
    """An LRU of the last `size` distinct step token counts a worker ran."""

    size: int
    counts: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def run(self, counts: list[int], undo: Undo | None = None) -> tuple[int, Undo | None]:
        """Steps of these token counts run, in order, in place of the step `undo` names (a step that
        grew before it began: its count, if it was new, is forgotten again and the count it evicted
        comes back as the oldest). Returns how many of the counts were new, and the undo of this run
        when it is one step whose count was new (else None)."""
        if undo is not None:
            count, evicted = undo
            self.counts.pop(count, None)
            if evicted is not None:
                self.counts[evicted] = None
                self.counts.move_to_end(evicted, last=False)
        new, undo = 0, None
        for count in counts:
            if count in self.counts:
                self.counts.move_to_end(count)
                continue
            self.counts[count] = None
            evicted = self.counts.popitem(last=False)[0] if len(self.counts) > self.size else None
            new, undo = new + 1, (count, evicted)
        return new, undo if len(counts) == 1 else None


def step_counts(tokens: int, rows: int, budget: int) -> list[int]:
    """The new-token counts of the steps that prefill `tokens` uncached prompt tokens beside `rows`
    decode rows, `budget` tokens a step: whole chunks, then the rest with the rows (a fully cached
    prompt still computes its last token). Approximate past one chunk: the engine's budget counts
    the rows too."""
    chunks = max(1, -(-tokens // budget))
    return [budget] * (chunks - 1) + [max(1, tokens - (chunks - 1) * budget) + rows]
