"""Worker registry: who is alive (from heartbeats), what it reports, and what we routed to it.

Pure and synchronous; time comes from an injected clock so tests can move it by hand.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .split import PoolSplit

Clock = Callable[[], float]


class Role(enum.IntEnum):
    """Same numbers as `kvmesh.v1.WorkerRole`."""

    PREFILL = 1
    DECODE = 2
    KVSTORE = 3


class Seen(enum.Enum):
    NEW = "new"
    RESTARTED = "restarted"
    UPDATED = "updated"


@dataclass(frozen=True, slots=True)
class HeartbeatInfo:
    worker_id: str
    role: Role
    endpoint: str = ""
    pool: str = "production"
    model: str = ""
    block_size: int = 16
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    max_num_seqs: int = 0
    started_at: float = 0.0
    draining: bool = False
    kv_event_seq: int = 0
    live_request_ids: frozenset[str] | None = None  # decode workers that report what they hold
    max_model_len: int = 0  # the worker engine's context length (0 = not reported)
    engine_progress: int | None = None  # engine steps that advanced a request (None = not reported)


@dataclass(slots=True)
class Worker:
    """A live worker: its last heartbeat plus the scheduler's own view of its load."""

    info: HeartbeatInfo
    last_seen: float
    inflight: int = 0                 # routed requests not completed yet
    routed_since_heartbeat: int = 0   # routed after the last heartbeat was taken
    completed_since_heartbeat: int = 0
    backlog_s: float = 0.0            # estimated prefill work queued, seconds, at `backlog_at`
    backlog_at: float = 0.0
    progress_at: float = 0.0          # when its engine_progress last moved (or it had no work)

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    @property
    def load(self) -> int:
        """Requests on the worker: its last report plus what we sent since (minus what completed
        since, for decode workers), and never less than our own in-flight count.
        NOTE: without subtracting completions, a warm worker serving a quick sequence of requests
        looked busier with each one until its next heartbeat. Prefill workers finish long before
        Complete arrives, so for them only the report and what we sent count."""
        reported = self.info.num_running + self.info.num_waiting + self.routed_since_heartbeat
        if self.info.role is not Role.DECODE:
            return reported
        return max(self.inflight, reported - self.completed_since_heartbeat)

    @property
    def capacity(self) -> int:
        return max(1, self.info.max_num_seqs)

    def backlog(self, now: float) -> float:
        """Prefill seconds still queued, draining at one second per second."""
        return max(0.0, self.backlog_s - (now - self.backlog_at))


@dataclass(frozen=True, slots=True)
class Assignment:
    request_id: str
    decode_id: str
    prefill_id: str | None
    routed_at: float


@dataclass(slots=True)
class Registry:
    """Live workers keyed by id; `expire()` drops those silent for `heartbeat_timeout_s`."""

    heartbeat_timeout_s: float = 3.0
    clock: Clock = time.monotonic
    reconcile_grace_s: float = 5.0  # a routed request the worker still does not hold after this is reclaimed
    stall_s: float = 10.0  # a worker with work whose engine_progress has not moved for this long gets no new requests
    split: PoolSplit = field(default_factory=PoolSplit)  # production pool (and a canary's share)
    _workers: dict[str, Worker] = field(default_factory=dict)
    _assignments: dict[str, Assignment] = field(default_factory=dict)
    _orphaned: list[Assignment] = field(default_factory=list)
    _sorted: list[Worker] | None = None

    @property
    def production_pool(self) -> str:
        return self.split.production

    def observe(self, hb: HeartbeatInfo) -> Seen:
        """Records a heartbeat; a new `started_at` resets the worker's state (RESTARTED)."""
        if not hb.worker_id:
            raise ValueError("heartbeat without worker_id")
        now = self.clock()
        worker = self._workers.get(hb.worker_id)
        if worker is not None and worker.info.started_at == hb.started_at and worker.info.role == hb.role:
            if hb.engine_progress is None or hb.engine_progress != worker.info.engine_progress or not (
                    hb.num_running or hb.num_waiting):
                worker.progress_at = now
            worker.info, worker.last_seen, worker.routed_since_heartbeat = hb, now, 0
            worker.completed_since_heartbeat = 0
            self._reconcile(worker, now)
            return Seen.UPDATED
        seen = Seen.NEW if worker is None else Seen.RESTARTED
        if worker is not None:
            self._drop_assignments(hb.worker_id)
        self._workers[hb.worker_id] = Worker(hb, now, backlog_at=now, progress_at=now)
        self._sorted = None
        return seen

    def grace(self) -> None:
        """Counts every worker as just seen: after our own NATS outage their heartbeats were not
        missing, we were deaf, so nobody is evicted before their next beat can arrive."""
        now = self.clock()
        for worker in self._workers.values():
            worker.last_seen = now

    def expire(self) -> list[str]:
        """Removes workers whose last heartbeat is older than the timeout; returns their ids."""
        now = self.clock()
        dead = [w.worker_id for w in self._workers.values() if now - w.last_seen > self.heartbeat_timeout_s]
        for worker_id in dead:
            self.remove(worker_id)
        return dead

    def remove(self, worker_id: str) -> list[Assignment]:
        """Forgets a worker; returns the assignments that were still open on it."""
        self._workers.pop(worker_id, None)
        self._sorted = None
        return self._drop_assignments(worker_id)

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def all(self) -> list[Worker]:
        """Every known worker, sorted by id."""
        if self._sorted is None:
            self._sorted = sorted(self._workers.values(), key=lambda w: w.worker_id)
        return list(self._sorted)

    def live(self, role: Role, pool: str | None = None, exclude: Iterable[str] = ()) -> list[Worker]:
        """Workers of `role` in `pool` that take new requests (not draining, engine not stalled:
        work pending and `engine_progress` unchanged for `stall_s`), sorted by id."""
        skip = set(exclude)
        stalled_before = self.clock() - self.stall_s
        if self._sorted is None:
            self._sorted = sorted(self._workers.values(), key=lambda w: w.worker_id)
        return [
            w
            for w in self._sorted
            if w.info.role is role and not w.info.draining and w.worker_id not in skip and (pool is None or w.info.pool == pool)
            and w.progress_at >= stalled_before
        ]

    def pools(self) -> set[str]:
        return {w.info.pool for w in self._workers.values()}

    # --- what the scheduler sent ---

    def assign(self, request_id: str, decode_id: str, prefill_id: str | None, prefill_s: float) -> Assignment:
        """Counts a routed request on its workers; `prefill_s` of work joins the prefill worker's
        backlog (the decode worker's when `prefill_id` is None)."""
        now = self.clock()
        assignment = Assignment(request_id, decode_id, prefill_id, now)
        self._assignments[request_id] = assignment
        decode = self._workers[decode_id]
        decode.inflight += 1
        decode.routed_since_heartbeat += 1
        target = decode if prefill_id is None else self._workers[prefill_id]
        if prefill_id is not None:
            target.routed_since_heartbeat += 1
        target.backlog_s, target.backlog_at = target.backlog(now) + prefill_s, now
        return assignment

    def observe_peer_route(self, decode_id: str, prefill_id: str | None, prefill_s: float) -> None:
        """A request a peer scheduler replica routed: it counts in the workers' load (and prefill
        backlog) until their next heartbeat reports it. Unknown workers are ignored."""
        now = self.clock()
        decode = self._workers.get(decode_id)
        target = decode if prefill_id is None else self._workers.get(prefill_id)
        if decode is None or target is None:
            return
        decode.routed_since_heartbeat += 1
        if prefill_id is not None:
            target.routed_since_heartbeat += 1
        target.backlog_s, target.backlog_at = target.backlog(now) + max(0.0, prefill_s), now

    def observe_peer_complete(self, decode_id: str) -> None:
        """A request a peer replica routed to `decode_id` completed (until its next heartbeat)."""
        worker = self._workers.get(decode_id)
        if worker is not None:
            worker.completed_since_heartbeat += 1

    def complete(self, request_id: str) -> Assignment | None:
        """Releases a routed request; None when unknown (already completed or worker gone)."""
        assignment = self._assignments.pop(request_id, None)
        if assignment is not None:
            worker = self._workers.get(assignment.decode_id)
            if worker is not None:
                worker.inflight = max(0, worker.inflight - 1)
                worker.completed_since_heartbeat += 1
        return assignment

    def drain_orphaned(self) -> list[Assignment]:
        """Assignments dropped because their decode worker died or restarted (their admission
        slots must be released); each is returned once."""
        orphaned, self._orphaned = self._orphaned, []
        return orphaned

    def open_assignments(self) -> int:
        return len(self._assignments)

    def _reconcile(self, worker: Worker, now: float) -> None:
        """Reclaims requests routed to `worker` that it no longer holds, by its own report.

        NOTE: a lost Complete (a gateway that crashed, a partition) used to leave the assignment
        and the worker's in-flight count forever: the worker looked busier each time, and its
        admission slot stayed taken. Requests routed within `reconcile_grace_s` are spared: the
        heartbeat may have been taken before they arrived."""
        live = worker.info.live_request_ids
        if live is None:
            return
        stale = [
            a for a in self._assignments.values()
            if a.decode_id == worker.worker_id and a.request_id not in live and now - a.routed_at > self.reconcile_grace_s
        ]
        for a in stale:
            self.complete(a.request_id)
        self._orphaned.extend(stale)

    def _drop_assignments(self, worker_id: str) -> list[Assignment]:
        gone = [a for a in self._assignments.values() if a.decode_id == worker_id]
        for a in gone:
            del self._assignments[a.request_id]
        self._orphaned.extend(gone)
        return gone
