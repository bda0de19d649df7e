"""kv_aware: one cost per worker, the blocks it still has to prefill plus its decode load."""

from __future__ import annotations

import math
import random

from .policy import Choice, Policy, PolicyConfig, RoutingState, WorkerView, softmax_pick


class KvAware(Policy):
    """cost = prefill_weight × blocks_to_prefill + decode_weight × load, where

    - blocks_to_prefill = this request's blocks minus the overlap credit, plus `kv_queue_weight`
      × the prefill work already queued on the worker (in blocks; 0 = ignore the queue);
    - overlap credit = cached blocks × exp(-excess / overlap_decay), excess being how far the
      worker's utilization sits above the mean, so a warm but busy worker stops always winning.

    Lowest cost wins (ties: fewer in flight, then id); with a temperature > 0 the winner is drawn
    from a softmax over -cost / temperature.
    """

    name = "kv_aware"
    predicts = True

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)

    def credit_blocks(self, worker: WorkerView, mean_utilization: float) -> float:
        excess = max(0.0, worker.utilization - mean_utilization)
        if self.config.kv_overlap_decay <= 0.0 or excess == 0.0:
            return float(worker.cached_blocks)
        return worker.cached_blocks * math.exp(-excess / self.config.kv_overlap_decay)

    def cost(self, state: RoutingState, worker: WorkerView, mean_utilization: float) -> float:
        block_s = state.cost.prefill_s_per_token * state.cost.block_size
        queued_blocks = self.config.kv_queue_weight * worker.backlog_s / block_s if block_s > 0 else 0.0
        new_blocks = state.request.num_blocks - self.credit_blocks(worker, mean_utilization)
        prefill = queued_blocks + new_blocks
        return self.config.kv_prefill_weight * prefill + self.config.kv_decode_weight * worker.load

    def choose(self, state: RoutingState) -> Choice:
        mean = state.mean_utilization()
        costs = [self.cost(state, w, mean) for w in state.workers]
        if self.config.kv_temperature > 0.0:
            i = softmax_pick(costs, self.config.kv_temperature, self._rng)
        else:
            i = min(range(len(costs)), key=lambda j: (costs[j], state.workers[j].load, state.workers[j].worker_id))
        return Choice(state.workers[i].worker_id, costs[i])
