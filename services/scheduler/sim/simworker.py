"""The simulator's per-request and per-worker state (cluster.py drives them): a request's result,
and a worker's prefix cache (an LRU of block hashes), the token counts its prefill steps ran at
lately (an LRU of counts), batch, prefill queue and the time it lost to stalls and pauses."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..registry import Role
from ..router import RouteDecision
from .meshcost import MeshCost
from .shapes import KERNEL_CACHE_COUNTS, ShapeCache, Undo, step_counts
from .steps import StepFigures
from .trace import TraceRequest


@dataclass(slots=True)
class RequestResult:
    request: TraceRequest
    decode_id: str
    hashes: tuple[bytes, ...] = ()
    router: int = 0                 # the replica that routed it (gets its completion)
    cached_tokens: int = 0
    first_token_s: float = 0.0
    finish_s: float = 0.0
    status: int = 200               # 429 / 504: refused or timed out in admission (MeshCost)
    stall_mark: float = 0.0         # the worker's stall_s when this sequence's finish was last scheduled
    pause_mark: float = 0.0         # the worker's paused_s when its first token was last scheduled
    batch: PrefillBatch | None = None  # the engine step that prefills it (local prefills)
    batch_mark: float = 0.0         # that step's end when its first token was last scheduled
    noise: float = 1.0              # its latency factor (MeshCost.noise)
    started_s: float = math.nan     # when its decode worker took it (its engine's add)
    hidden_s: float = 0.0           # its first token → its first visible text at the client (MeshCost.hidden_tokens)
    queue_s: float = math.nan       # on its first token: started → its prefill step's start (local prefills)
    prefill_s: float = math.nan     # on its first token: its prefill step's start → end, as the engine measures it

    @property
    def ttft_s(self) -> float:
        """To its first token, as the gateway's TTFT histogram has it (the client's: + hidden_s)."""
        return self.first_token_s - self.request.arrival_s


@dataclass(slots=True)
class PrefillBatch:
    """One engine step's prefills on a worker: the prompts that were waiting when it began."""

    start_s: float
    end_s: float
    tokens: int
    rows: int = 0                   # decode rows riding along: the step runs tokens + rows new tokens
    new_shape_s: float = 0.0        # what its token count cost for being new (MeshCost.prefill_s_new_shape)
    shape_undo: Undo | None = None  # how to take its token count back out of the worker's ShapeCache


@dataclass(slots=True)
class SimWorker:
    worker_id: str
    role: Role
    kv_blocks: int
    max_num_seqs: int
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    running: int = 0
    slot_queue: deque[tuple[RequestResult, RouteDecision]] = field(default_factory=deque)
    busy_until: float = 0.0
    seq: int = 0
    load_area: float = 0.0          # ∫ (running + waiting) dt, for the imbalance figure
    load_since: float = 0.0
    stall_s: float = 0.0            # decode time lost to local prefills and pauses so far (MeshCost)
    paused_s: float = 0.0           # time lost to the worker's pauses so far (MeshCost.pause_rate_hz)
    contexts: list[float] = field(default_factory=list)  # mean context (prompt + output / 2) of each sequence here
    batch: PrefillBatch | None = None  # its latest prefill step (joinable until it starts)
    shapes: ShapeCache = field(default_factory=lambda: ShapeCache(KERNEL_CACHE_COUNTS))  # its prefill steps' recent counts
    steps: StepFigures = field(default_factory=StepFigures)  # what its engine steps ran (steps.py)
    tally_since: float = 0.0        # when `steps` was last brought up to date
    running_s: float = 0.0          # time it had sequences so far

    def cached_prefix(self, hashes: tuple[bytes, ...]) -> int:
        n = 0
        for h in hashes:
            if h not in self.cache:
                break
            n += 1
        return n

    def insert(self, hashes: tuple[bytes, ...]) -> tuple[list[bytes], list[bytes]]:
        """Adds/touches blocks (LRU); returns (stored, removed)."""
        stored, removed = [], []
        for h in hashes:
            if h in self.cache:
                self.cache.move_to_end(h)
            else:
                self.cache[h] = None
                stored.append(h)
        while len(self.cache) > self.kv_blocks:
            removed.append(self.cache.popitem(last=False)[0])
        return stored, removed

    def new_shape_s(self, batch: PrefillBatch, tokens: int, mesh: MeshCost, budget: int) -> float:
        """How much more `batch`'s step here costs now that it prefills `tokens` uncached tokens beside
        its decode rows: mesh.prefill_s_new_shape for each of its token counts not run here lately
        (shapes.py), less what it was charged before (a step joined before it began)."""
        if not mesh.prefill_s_new_shape:
            return 0.0
        new, batch.shape_undo = self.shapes.run(step_counts(tokens, batch.rows, budget), batch.shape_undo)
        before, batch.new_shape_s = batch.new_shape_s, new * mesh.prefill_s_new_shape
        return batch.new_shape_s - before

    def mark_load(self, now: float) -> None:
        self.load_area += (self.running + len(self.slot_queue)) * (now - self.load_since)
        self.load_since = now
