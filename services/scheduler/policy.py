"""Routing policies behind one interface, and the snapshot they decide on.

A policy sees a `RoutingState` (the request, the candidate workers with their load and cached
prefix, the cost model) and returns a `Choice`. The scheduler service and the simulator build
the same snapshot and call the very same classes.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per unit of work, calibrated on the real engine (see bench/sim_calibration.md)."""

    prefill_s_per_token: float = 5.76e-5
    decode_s_per_step: float = 1.02e-3
    decode_s_per_seq: float = 3.57e-5
    block_size: int = 16

    def prefill_s(self, tokens: float) -> float:
        return max(0.0, tokens) * self.prefill_s_per_token

    def step_s(self, running: int) -> float:
        return self.decode_s_per_step + self.decode_s_per_seq * running


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    num_prompt_tokens: int
    block_hashes: tuple[bytes, ...] = ()
    session_id: str = ""
    max_tokens: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes)


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    load: int                 # requests on the worker (running + waiting)
    capacity: int = 1         # max_num_seqs
    cached_blocks: int = 0    # leading blocks of this request it holds (or is predicted to)
    backlog_s: float = 0.0    # estimated prefill work queued on it, seconds

    @property
    def utilization(self) -> float:
        return self.load / max(1, self.capacity)


@dataclass(frozen=True, slots=True)
class RoutingState:
    request: RequestView
    workers: tuple[WorkerView, ...]   # candidates, non-empty, sorted by worker_id
    cost: CostModel = CostModel()

    def uncached_tokens(self, worker: WorkerView, credit_blocks: float | None = None) -> float:
        credit = worker.cached_blocks if credit_blocks is None else credit_blocks
        return max(0.0, self.request.num_prompt_tokens - credit * self.cost.block_size)

    def predicted_ttft_s(self, worker: WorkerView) -> float:
        """Queued prefill + this request's uncached prefill + one decode step."""
        return worker.backlog_s + self.cost.prefill_s(self.uncached_tokens(worker)) + self.cost.step_s(worker.load)

    def mean_utilization(self) -> float:
        return sum(w.utilization for w in self.workers) / len(self.workers)


@dataclass(frozen=True, slots=True)
class Choice:
    worker_id: str
    score: float = 0.0   # the winner's cost under the policy (lower is better)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the policies (the scheduler settings carry the same names)."""

    kv_prefill_weight: float = 1.0
    kv_decode_weight: float = 2.0
    kv_temperature: float = 0.0
    kv_overlap_decay_requests: float = 6.0
    kv_queue_weight: float = 0.5
    dualmap_ttft_slo_s: float = 1.0
    dualmap_prefix_blocks: int = 4
    dualmap_hot_factor: float = 2.0
    seed: int = 0


class Policy(ABC):
    """Picks one worker out of `state.workers`."""

    name: ClassVar[str]
    # whether the router should record predicted index entries for the winner
    predicts: ClassVar[bool] = False

    @abstractmethod
    def choose(self, state: RoutingState) -> Choice: ...


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, state: RoutingState) -> Choice:
        worker = state.workers[self._next % len(state.workers)]
        self._next += 1
        return Choice(worker.worker_id)


class LeastLoaded(Policy):
    name = "least_loaded"

    def choose(self, state: RoutingState) -> Choice:
        worker = min(state.workers, key=lambda w: (w.utilization, w.backlog_s, w.worker_id))
        return Choice(worker.worker_id, worker.utilization)


class PrefixAffinity(Policy):
    """Most cached leading blocks wins; ties go to the least loaded."""

    name = "prefix_affinity"
    predicts = True

    def choose(self, state: RoutingState) -> Choice:
        worker = min(state.workers, key=lambda w: (-w.cached_blocks, w.utilization, w.worker_id))
        return Choice(worker.worker_id, -worker.cached_blocks)


def softmax_pick(costs: list[float], temperature: float, rng: random.Random) -> int:
    """Index drawn with probability ∝ exp(-(cost - min) / temperature)."""
    low = min(costs)
    weights = [math.exp(-(c - low) / temperature) for c in costs]
    return rng.choices(range(len(costs)), weights=weights)[0]


def make_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """The policy called `name` (one of POLICY_NAMES)."""
    from .policy_dualmap import DualMap  # noqa: PLC0415 - the two modules import each other
    from .policy_kv import KvAware  # noqa: PLC0415

    config = config or PolicyConfig()
    factories = {
        RoundRobin.name: RoundRobin,
        LeastLoaded.name: LeastLoaded,
        PrefixAffinity.name: PrefixAffinity,
        KvAware.name: lambda: KvAware(config),
        DualMap.name: lambda: DualMap(config),
    }
    if name not in factories:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICY_NAMES)}")
    return factories[name]()


POLICY_NAMES = ("round_robin", "least_loaded", "prefix_affinity", "kv_aware", "dualmap")
