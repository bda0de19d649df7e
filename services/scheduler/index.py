"""Global block index: which worker holds which KV block, fed by each worker's KV events.

Per worker it tracks the last applied batch `seq`. A batch that skips ahead is a gap: the index
buffers what follows and asks (by returning `from_seq`) for a replay; `apply_replay` applies the
missing batches or a full dump and then the buffered ones. Entries predicted at routing time
(`predict`) count as held until they expire, so a burst of same-prefix requests sees the blocks
before the worker's events arrive. Pure and synchronous.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Stored:
    block_hashes: tuple[bytes, ...]
    parent_hash: bytes | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    worker_id: str
    seq: int
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    """A publisher's answer to a replay request: missing batches, or the full held set at `seq`."""

    batches: tuple[EventBatch, ...] = ()
    full_dump: bool = False
    held: tuple[bytes, ...] = ()
    seq: int = 0


@dataclass(slots=True)
class IndexStats:
    batches_applied: int = 0
    gaps: int = 0
    full_dumps: int = 0
    abandoned_repairs: int = 0


@dataclass(slots=True)
class BlockIndex:
    """`apply(batch)` returns None, or the `from_seq` of the replay to request for that worker."""

    max_buffered: int = 4096
    max_predictions: int = 100_000
    stats: IndexStats = field(default_factory=IndexStats)
    _holders: dict[bytes, set[str]] = field(default_factory=dict)
    _held: dict[str, set[bytes]] = field(default_factory=dict)
    _seq: dict[str, int] = field(default_factory=dict)
    _repairing: dict[str, list[EventBatch]] = field(default_factory=dict)
    _behind: dict[str, int] = field(default_factory=dict)
    _predicted: dict[bytes, dict[str, float]] = field(default_factory=dict)
    _expiries: deque[tuple[float, str, tuple[bytes, ...]]] = field(default_factory=deque)

    # --- feeding ---

    def apply(self, batch: EventBatch) -> int | None:
        worker_id = batch.worker_id
        buffered = self._repairing.get(worker_id)
        if buffered is not None:
            if len(buffered) < self.max_buffered:
                buffered.append(batch)
            return None
        last = self._seq.get(worker_id, 0)
        if batch.seq == 1 and last >= 1:
            # NOTE: a publisher that restarts numbers from 1 again; what it held before is gone.
            self._clear(worker_id)
            last = 0
        if batch.seq <= last:
            return None
        if batch.seq == last + 1:
            self._apply_batch(batch)
            return None
        self.stats.gaps += 1
        self._repairing[worker_id] = [batch]
        return last + 1

    def check_seq(self, worker_id: str, reported_seq: int) -> int | None:
        """A heartbeat's `kv_event_seq`: if we are still behind a seq reported one heartbeat ago,
        a trailing batch was lost; returns the replay's `from_seq` then. For a worker we have no
        events of at all (this replica just started, or the worker restarted), at once: nothing
        in flight can fill that gap."""
        last = self._seq.get(worker_id, 0)
        if worker_id in self._repairing or reported_seq <= last:
            self._behind.pop(worker_id, None)
            return None
        earlier = self._behind.get(worker_id)
        self._behind[worker_id] = reported_seq
        if worker_id in self._seq and (earlier is None or earlier <= last):
            return None
        self.stats.gaps += 1
        self._behind.pop(worker_id, None)
        self._repairing[worker_id] = []
        return last + 1

    def apply_replay(self, worker_id: str, replay: Replay) -> int | None:
        """Repairs a gap; returns a new `from_seq` if the buffered batches still do not line up."""
        if replay.full_dump:
            self.stats.full_dumps += 1
            self._clear(worker_id)
            self._add(worker_id, replay.held)
            self._seq[worker_id] = replay.seq
        for batch in sorted(replay.batches, key=lambda b: b.seq):
            if batch.seq == self._seq.get(worker_id, 0) + 1:
                self._apply_batch(batch)
        buffered = sorted(self._repairing.pop(worker_id, []), key=lambda b: b.seq)
        for i, batch in enumerate(buffered):
            last = self._seq.get(worker_id, 0)
            if batch.seq <= last:
                continue
            if batch.seq != last + 1:
                self.stats.gaps += 1
                self._repairing[worker_id] = buffered[i:]
                return last + 1
            self._apply_batch(batch)
        return None

    def abandon_repair(self, worker_id: str) -> None:
        """The replay failed: forget what the worker held (better a cold miss than a phantom
        hit) and carry on from its buffered batches."""
        self.stats.abandoned_repairs += 1
        buffered = sorted(self._repairing.pop(worker_id, []), key=lambda b: b.seq)
        self._clear(worker_id)
        for batch in buffered:
            self._apply_batch(batch)

    def repairing(self, worker_id: str) -> bool:
        return worker_id in self._repairing

    def drop_worker(self, worker_id: str) -> None:
        """Forgets everything about a worker (its heartbeats stopped or it restarted)."""
        self._clear(worker_id)
        self._seq.pop(worker_id, None)
        self._repairing.pop(worker_id, None)
        self._behind.pop(worker_id, None)
        for block_hash in [h for h, holders in self._predicted.items() if worker_id in holders]:
            holders = self._predicted[block_hash]
            del holders[worker_id]
            if not holders:
                del self._predicted[block_hash]

    # --- predictions ---

    def predict(self, worker_id: str, block_hashes: Sequence[bytes], expires_at: float) -> None:
        """Counts `block_hashes` as held by `worker_id` until `expires_at` (routing-time guess)."""
        for block_hash in block_hashes:
            self._predicted.setdefault(block_hash, {})[worker_id] = expires_at
        self._expiries.append((expires_at, worker_id, tuple(block_hashes)))

    def prune_predictions(self, now: float) -> None:
        """Forgets expired predictions (amortized: each prediction is visited once)."""
        while self._expiries and (self._expiries[0][0] <= now or len(self._expiries) > self.max_predictions):
            expires_at, worker_id, block_hashes = self._expiries.popleft()
            for block_hash in block_hashes:
                holders = self._predicted.get(block_hash)
                if holders is not None and holders.get(worker_id) == expires_at:
                    del holders[worker_id]
                    if not holders:
                        del self._predicted[block_hash]

    # --- queries ---

    def overlap(self, worker_ids: Iterable[str], block_hashes: Sequence[bytes], now: float | None = None) -> dict[str, int]:
        """Leading blocks of `block_hashes` each worker holds (longest contiguous prefix).
        Predicted entries count when `now` is given and they have not expired."""
        counts = dict.fromkeys(worker_ids, 0)
        alive = set(counts)
        for i, block_hash in enumerate(block_hashes):
            holders = self._holders.get(block_hash)
            predicted = self._predicted.get(block_hash) if now is not None else None
            if predicted:
                guessed = {w for w, t in predicted.items() if t > now}  # type: ignore[operator]
                held = alive & (holders | guessed if holders else guessed)
            else:
                held = alive & holders if holders else set()
            for w in alive - held:
                counts[w] = i
            alive = held
            if not alive:
                return counts
        for w in alive:
            counts[w] = len(block_hashes)
        return counts

    def union_overlap(self, worker_ids: Iterable[str], block_hashes: Sequence[bytes]) -> int:
        """Leading blocks of `block_hashes` held by at least one of `worker_ids` together (the
        shards of a sharded KV store: each holds only its share of a prompt's blocks)."""
        ids = set(worker_ids)
        for i, block_hash in enumerate(block_hashes):
            if not ids & self._holders.get(block_hash, set()):
                return i
        return len(block_hashes) if ids else 0

    def held(self, worker_id: str) -> set[bytes]:
        return set(self._held.get(worker_id, ()))

    def last_seq(self, worker_id: str) -> int:
        return self._seq.get(worker_id, 0)

    @property
    def num_entries(self) -> int:
        return sum(len(h) for h in self._held.values())

    # --- internals ---

    def _apply_batch(self, batch: EventBatch) -> None:
        worker_id = batch.worker_id
        for event in batch.events:
            if isinstance(event, Stored):
                self._add(worker_id, event.block_hashes)
            elif isinstance(event, Removed):
                self._remove(worker_id, event.block_hashes)
            else:
                self._clear(worker_id)
        self._seq[worker_id] = batch.seq
        self.stats.batches_applied += 1

    def _add(self, worker_id: str, block_hashes: Iterable[bytes]) -> None:
        held = self._held.setdefault(worker_id, set())
        for block_hash in block_hashes:
            held.add(block_hash)
            self._holders.setdefault(block_hash, set()).add(worker_id)

    def _remove(self, worker_id: str, block_hashes: Iterable[bytes]) -> None:
        held = self._held.get(worker_id)
        if held is None:
            return
        for block_hash in block_hashes:
            held.discard(block_hash)
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[block_hash]

    def _clear(self, worker_id: str) -> None:
        for block_hash in self._held.pop(worker_id, ()):
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[block_hash]
