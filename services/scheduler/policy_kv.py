"""kv_aware: one cost per worker, the blocks it still has to prefill plus its decode load."""

from __future__ import annotations

import math
import random

from .policy import Choice, Policy, PolicyConfig, RoutingState, WorkerView, softmax_pick


def excess_requests(worker: WorkerView, mean_utilization: float) -> float:
    """Requests the worker carries above its fair share (its capacity × the fleet's mean
    utilization); 0 when at or below it."""
    return max(0.0, worker.load - worker.capacity * mean_utilization)


def overlap_credit(cached_blocks: int, excess: float, decay_requests: float) -> float:
    """Blocks of a worker's cached prefix that count as free: cached_blocks × exp(-excess /
    decay_requests), with `excess` in requests above the worker's fair share; decay_requests
    <= 0 keeps the full credit whatever the load.

    NOTE: excess is counted in requests, not utilization, because the cost it is weighed against
    (decode_weight × load) is per request too. In utilization units the same setting let a warm
    worker run 4 requests hot at max_num_seqs 8 but 32 at 64, which overloaded the warm workers
    of large fleets.
    """
    if decay_requests <= 0.0 or excess <= 0.0:
        return float(cached_blocks)
    return cached_blocks * math.exp(-excess / decay_requests)


class KvAware(Policy):
    """cost = prefill_weight × blocks_to_prefill + decode_weight × load, where

    - blocks_to_prefill = this request's blocks minus the overlap credit, plus `kv_queue_weight`
      × the prefill work already queued on the worker (in blocks; 0 = ignore the queue);
    - overlap credit = cached blocks × exp(-excess / kv_overlap_decay_requests), excess being the
      requests the worker carries above its fair share of the fleet's load, so a warm but busy
      worker stops always winning (see `overlap_credit`).

    Lowest cost wins (ties: fewer in flight, then id); with a temperature > 0 the winner is drawn
    from a softmax over -cost / temperature.
    """

    name = "kv_aware"
    predicts = True

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)

    def credit_blocks(self, worker: WorkerView, mean_utilization: float) -> float:
        excess = excess_requests(worker, mean_utilization)
        return overlap_credit(worker.cached_blocks, excess, self.config.kv_overlap_decay_requests)

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
