"""The canary's state: which pool is which, the mirror buffer, the running comparison, the verdict.

Synchronous and I/O-free; the async shell feeds it records and replay outcomes. Every switch of
the pools (a full promote, or the rollback of one) starts a new comparison (a new `generation`);
outcomes of replays started before it are ignored, so a verdict never mixes two candidates.

A stepwise promote (weight below 1) only gives the candidate that share of production traffic: the
pools and the comparison stay, and mirrored requests the candidate served itself are not compared.

Beside the comparison runs a `Window` (a rollout step's): `open_window()` starts a new one; only
jobs taken after it opened count in it, and it counts the production requests each pool served.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.runtime.pb import events_pb2

from .buffer import Admission, MirrorBuffer
from .compare import Comparison, Outcome, Summary
from .records import check_record, content_key, is_server_error, production_outcome, record_size
from .verdict import Decision, Thresholds, decide
from .window import Window


@dataclass(frozen=True, slots=True)
class Pools:
    production: str
    candidate: str

    def swapped(self) -> Pools:
        return Pools(production=self.candidate, candidate=self.production)


@dataclass(frozen=True, slots=True)
class Job:
    """One buffered record to replay, with the pools and generation it was taken under."""

    record: events_pb2.MirrorRecord
    production: Outcome
    pools: Pools
    generation: int
    window: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    decision: Decision
    summary: Summary
    pools: Pools
    received: int
    dropped: int
    duplicates: int
    malformed: int
    buffered: int
    promoted_weight: float = 0.0
    candidate_served: int = 0
    warmup_left: int = 0


class CanaryState:
    """Buffer + comparison + pools. `configured` is the pool pair from settings (what rollback restores)."""

    def __init__(
        self,
        configured: Pools,
        thresholds: Thresholds,
        buffer: MirrorBuffer[events_pb2.MirrorRecord],
        latency_window: int = 10_000,
        warmup_replays: int = 0,
    ) -> None:
        if configured.production == configured.candidate:
            raise ValueError(f"production and candidate pools must differ (both {configured.production!r})")
        self.configured = configured
        self.pools = configured
        self.thresholds = thresholds
        self.buffer = buffer
        self.generation = 0
        self.received = 0
        self.malformed = 0
        self.weight = 0.0  # share of production traffic the candidate pool serves
        self.candidate_served = 0
        self._latency_window = latency_window
        self._comparison = Comparison(latency_window)
        self.window = Window(0, latency_window)
        self._warmup_replays = warmup_replays
        self.warmup_left = warmup_replays  # candidate replays still to discard: one-time start-up costs

    def offer(self, record: events_pb2.MirrorRecord) -> Admission | None:
        """Takes one mirrored record into the buffer; None when it is malformed or the candidate
        served it (each counted, neither compared)."""
        self.received += 1
        if check_record(record) is not None:
            self.malformed += 1
            return None
        on_candidate = bool(record.pool) and record.pool == self.pools.candidate
        self.window.served.add(on_candidate, is_server_error(record.error))
        if on_candidate:
            self.candidate_served += 1
            return None
        return self.buffer.offer(record.request_id, content_key(record), record_size(record), record)

    def next_job(self) -> Job | None:
        entry = self.buffer.pop()
        if entry is None:
            return None
        return Job(entry.item, production_outcome(entry.item), self.pools, self.generation, self.window.id)

    def record_candidate(self, job: Job, candidate: Outcome) -> bool:
        """Adds a candidate replay; False when the job predates the last promote/rollback, or when
        it only warmed the candidate up (the first `warmup_replays` after a start or a switch)."""
        if job.generation != self.generation:
            return False
        if self.warmup_left > 0:
            self.warmup_left -= 1
            return False
        self._comparison.add_candidate(job.production, candidate)
        if job.window == self.window.id:
            self.window.comparison.add_candidate(job.production, candidate)
        return True

    def record_noise(self, job: Job, replay: Outcome) -> bool:
        """Adds a replay on production itself (the noise floor)."""
        if job.generation != self.generation:
            return False
        self._comparison.add_noise(job.production, replay)
        if job.window == self.window.id:
            self.window.comparison.add_noise(job.production, replay)
        return True

    def open_window(self) -> Window:
        """Starts a new window (a rollout step's); replays of jobs taken before it do not count in it."""
        self.window = Window(self.window.id + 1, self._latency_window)
        return self.window

    def noise_floor(self) -> tuple[float, int]:
        """Production's agreement with itself over the whole comparison, and how many replays it rests on."""
        summary = self._comparison.summary()
        return summary.noise_floor_agreement, summary.noise_samples

    def promote(self, weight: float = 1.0) -> Pools:
        """weight 1: the candidate pool becomes production (and the former production the
        candidate). Below 1: the candidate takes that share of production traffic."""
        check_weight(weight)
        if weight >= 1.0:
            self._switch(self.pools.swapped())
        else:
            self.weight = weight
        return self.pools

    def rollback(self) -> Pools:
        """Back to the configured pools with no production traffic on the candidate."""
        self.weight = 0.0
        if self.pools != self.configured:
            self._switch(self.configured)
        return self.pools

    def _switch(self, pools: Pools) -> None:
        self.pools = pools
        self.weight = 0.0
        self.generation += 1
        self.warmup_left = self._warmup_replays
        self._comparison = Comparison(self._latency_window)

    def report(self, undecodable: int = 0) -> Report:
        """The current report; `undecodable` adds messages the bus could not parse to `malformed`."""
        summary = self._comparison.summary()
        counts = self.buffer.counts()
        return Report(
            decision=decide(summary, self.thresholds),
            summary=summary,
            pools=self.pools,
            received=self.received,
            dropped=counts.dropped,
            duplicates=counts.duplicates,
            malformed=self.malformed + undecodable,
            buffered=counts.buffered,
            promoted_weight=self.weight,
            candidate_served=self.candidate_served,
            warmup_left=self.warmup_left,
        )


def check_weight(weight: float) -> None:
    """A promote weight is a share of production traffic in (0, 1]."""
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"promote weight must be in (0, 1], got {weight}")
