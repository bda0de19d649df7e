"""Admission: at most `slots` routed requests in flight, a bounded queue behind them.

Slots = the live decode workers' max_num_seqs summed, times `capacity_factor`; the queue holds
`queue_factor` × slots more. Beyond that a request is refused with a retry-after estimate (the
gateway answers 429). Queue order is by priority first (lower runs first, vLLM's semantics), then
FCFS or short-first; with aging: a waiting request that has been overtaken `aging_quota` times
goes next, so neither low-priority requests nor long prompts are starved.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Order(enum.StrEnum):
    FCFS = "fcfs"
    SHORT_FIRST = "short_first"


class QueueFull(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    capacity_factor: float = 1.0
    queue_factor: float = 1.0
    order: Order = Order.FCFS
    aging_quota: int = 8
    slot_timeout_s: float = 900.0        # a slot never completed is reclaimed after this
    retry_after_bounds_s: tuple[float, float] = (1.0, 30.0)


@dataclass(slots=True)
class Ticket:
    request_id: str
    cost: int            # prompt tokens: what "short" means
    seq: int             # arrival order
    priority: int = 0    # lower runs first
    skipped: int = 0     # times a later request was admitted first


@dataclass(slots=True)
class AdmissionQueue:
    config: AdmissionConfig = field(default_factory=AdmissionConfig)
    clock: Callable[[], float] = time.monotonic
    slots: int = 0
    mean_duration_s: float = 1.0         # EWMA of slot hold times, for retry-after
    _active: dict[str, float] = field(default_factory=dict)   # request_id -> admitted at
    _waiting: list[Ticket] = field(default_factory=list)
    _seq: int = 0

    @property
    def depth(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def queue_limit(self) -> int:
        return math.ceil(self.slots * self.config.queue_factor)

    def set_capacity(self, total_max_num_seqs: int) -> list[str]:
        """Resizes from the live decode workers' max_num_seqs; returns requests admitted now."""
        self.slots = math.ceil(max(0, total_max_num_seqs) * self.config.capacity_factor)
        return self._promote()

    def offer(self, request_id: str, cost: int, priority: int = 0) -> bool:
        """True: admitted now. False: queued (wait for `release` to name it). Raises QueueFull."""
        if request_id in self._active or any(t.request_id == request_id for t in self._waiting):
            self.cancel(request_id)  # NOTE: a retry with the same id replaces the earlier attempt
        if self.active < self.slots and not self._waiting:
            self._active[request_id] = self.clock()
            return True
        if self.depth >= self.queue_limit:
            raise QueueFull(
                f"admission queue full ({self.depth} waiting, {self.active}/{self.slots} in flight)", self.retry_after_s()
            )
        self._seq += 1
        self._waiting.append(Ticket(request_id, cost, self._seq, priority))
        return False

    def release(self, request_id: str) -> list[str]:
        """Frees the request's slot (or drops it from the queue); returns requests admitted now."""
        started = self._active.pop(request_id, None)
        if started is not None:
            held = max(0.0, self.clock() - started)
            self.mean_duration_s = 0.9 * self.mean_duration_s + 0.1 * held
        else:
            self._waiting = [t for t in self._waiting if t.request_id != request_id]
        return self._promote()

    cancel = release

    def reclaim(self) -> list[str]:
        """Releases slots held longer than `slot_timeout_s` (their Complete never came)."""
        cutoff = self.clock() - self.config.slot_timeout_s
        for request_id in [r for r, t in self._active.items() if t < cutoff]:
            del self._active[request_id]
        return self._promote()

    def retry_after_s(self) -> float:
        low, high = self.config.retry_after_bounds_s
        wait = (self.depth + 1) * self.mean_duration_s / max(1, self.slots)
        return min(high, max(low, round(wait, 1)))

    def _promote(self) -> list[str]:
        admitted = []
        while self._waiting and self.active < self.slots:
            ticket = self._next()
            self._waiting.remove(ticket)
            for other in self._waiting:
                if other.seq < ticket.seq:
                    other.skipped += 1
            self._active[ticket.request_id] = self.clock()
            admitted.append(ticket.request_id)
        return admitted

    def _next(self) -> Ticket:
        aged = [t for t in self._waiting if t.skipped >= self.config.aging_quota]
        if aged:
            return min(aged, key=lambda t: t.seq)
        if self.config.order is Order.FCFS:
            return min(self._waiting, key=lambda t: (t.priority, t.seq))
        return min(self._waiting, key=lambda t: (t.priority, t.cost, t.seq))
