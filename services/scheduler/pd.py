"""Decode-first P/D decision: the decode worker is chosen first, then where its prompt is prefilled.

Local prefill on the decode worker when the uncached part is short or every prefill worker is
queued; otherwise the prefill worker with the lowest predicted finish (queued work + what it must
compute, blocks held by the kvstore counting as cheap fetches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .policy import CostModel, RequestView, WorkerView


@dataclass(frozen=True, slots=True)
class PdConfig:
    local_prefill_max_tokens: int = 64   # uncached tokens a decode worker prefills itself
    prefill_queue_max_s: float = 2.0     # prefill workers count as queued beyond this backlog
    store_fetch_factor: float = 0.2      # a kvstore block costs this fraction of recomputing it


@dataclass(frozen=True, slots=True)
class PdDecision:
    prefill_id: str | None               # None = local prefill on the decode worker
    prefill_cached_blocks: int = 0
    reason: str = ""

    @property
    def local(self) -> bool:
        return self.prefill_id is None


def prefill_cost_s(
    request: RequestView, worker: WorkerView, store_blocks: int, cost: CostModel, config: PdConfig
) -> float:
    """Predicted seconds until `worker` has prefilled the prompt."""
    bs = cost.block_size
    own = worker.cached_blocks
    fetched = max(0, store_blocks - own)
    compute_tokens = max(0, request.num_prompt_tokens - max(own, store_blocks) * bs)
    return worker.backlog_s + cost.prefill_s(compute_tokens) + cost.prefill_s(fetched * bs) * config.store_fetch_factor


def decide(
    request: RequestView,
    decode: WorkerView,
    prefill: Sequence[WorkerView],
    cost: CostModel,
    config: PdConfig,
    store_blocks: int = 0,
) -> PdDecision:
    uncached = request.num_prompt_tokens - decode.cached_blocks * cost.block_size
    if not prefill:
        return PdDecision(None, reason="no_prefill_workers")
    if uncached <= config.local_prefill_max_tokens:
        return PdDecision(None, reason="short")
    best = min(prefill, key=lambda w: (prefill_cost_s(request, w, store_blocks, cost, config), w.worker_id))
    if best.backlog_s > config.prefill_queue_max_s:
        return PdDecision(None, reason="prefill_queued")
    return PdDecision(best.worker_id, best.cached_blocks, reason="remote")
