"""The canary's state: which pool is which, the mirror buffer, the running comparison, the verdict.

Synchronous and I/O-free; the async shell feeds it records and replay outcomes. Every promote or
rollback starts a new comparison (a new `generation`); outcomes of replays started before it are
ignored, so a verdict never mixes two candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.runtime.pb import events_pb2

from .buffer import Admission, MirrorBuffer
from .compare import Comparison, Outcome, Summary
from .records import check_record, content_key, production_outcome, record_size
from .verdict import Decision, Thresholds, decide


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


class CanaryState:
    """Buffer + comparison + pools. `configured` is the pool pair from settings (what rollback restores)."""

    def __init__(
        self,
        configured: Pools,
        thresholds: Thresholds,
        buffer: MirrorBuffer[events_pb2.MirrorRecord],
        latency_window: int = 10_000,
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
        self._latency_window = latency_window
        self._comparison = Comparison(latency_window)

    def offer(self, record: events_pb2.MirrorRecord) -> Admission | None:
        """Takes one mirrored record into the buffer; None when it is malformed (counted, dropped)."""
        self.received += 1
        if check_record(record) is not None:
            self.malformed += 1
            return None
        return self.buffer.offer(record.request_id, content_key(record), record_size(record), record)

    def next_job(self) -> Job | None:
        entry = self.buffer.pop()
        if entry is None:
            return None
        return Job(entry.item, production_outcome(entry.item), self.pools, self.generation)

    def record_candidate(self, job: Job, candidate: Outcome) -> bool:
        """Adds a candidate replay; False when the job predates the last promote/rollback."""
        if job.generation != self.generation:
            return False
        self._comparison.add_candidate(job.production, candidate)
        return True

    def record_noise(self, job: Job, replay: Outcome) -> bool:
        """Adds a replay on production itself (the noise floor)."""
        if job.generation != self.generation:
            return False
        self._comparison.add_noise(job.production, replay)
        return True

    def promote(self) -> Pools:
        """The candidate pool becomes production (and the former production the candidate)."""
        self._switch(self.pools.swapped())
        return self.pools

    def rollback(self) -> Pools:
        """Back to the configured pools; a no-op when already there."""
        if self.pools != self.configured:
            self._switch(self.configured)
        return self.pools

    def _switch(self, pools: Pools) -> None:
        self.pools = pools
        self.generation += 1
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
        )
