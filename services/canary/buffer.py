"""The mirror buffer: a bounded, deduplicated FIFO of records waiting for replay.

A slow candidate must never push back on production, so the buffer refuses instead of waiting:
a record that does not fit the record count or the byte budget is dropped and counted. A record
is a duplicate when its request id or its content key (prompt + sampling) was seen recently,
whether it is still queued or already replayed.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Admission(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    request_id: str
    content_key: bytes
    size_bytes: int
    item: T


@dataclass(frozen=True, slots=True)
class BufferCounts:
    accepted: int
    duplicates: int
    dropped: int
    buffered: int
    buffered_bytes: int


class _RecentKeys:
    """The last `capacity` keys seen, oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._keys: OrderedDict[object, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: object) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._capacity:
            self._keys.popitem(last=False)


class MirrorBuffer(Generic[T]):
    """FIFO of at most `max_records` entries and `max_bytes` bytes; never blocks, drops on full.

    `dedup_window` is how many recent request ids (and, separately, content keys) are remembered.
    """

    def __init__(self, max_bytes: int, max_records: int, dedup_window: int = 4096) -> None:
        if max_bytes <= 0 or max_records <= 0:
            raise ValueError("buffer max_bytes and max_records must be positive")
        self.max_bytes = max_bytes
        self.max_records = max_records
        self._queue: deque[Entry[T]] = deque()
        self._bytes = 0
        self._seen_ids = _RecentKeys(max(dedup_window, max_records))
        self._seen_content = _RecentKeys(max(dedup_window, max_records))
        self.accepted = 0
        self.duplicates = 0
        self.dropped = 0

    def offer(self, request_id: str, content_key: bytes, size_bytes: int, item: T) -> Admission:
        """Queues `item` unless it is a duplicate or does not fit (then it is counted and dropped)."""
        if request_id in self._seen_ids or content_key in self._seen_content:
            self.duplicates += 1
            return Admission.DUPLICATE
        if len(self._queue) >= self.max_records or self._bytes + size_bytes > self.max_bytes:
            # NOTE: a dropped record is not remembered, so a redelivery may still get in later.
            self.dropped += 1
            return Admission.FULL
        self._seen_ids.add(request_id)
        self._seen_content.add(content_key)
        self._queue.append(Entry(request_id, content_key, size_bytes, item))
        self._bytes += size_bytes
        self.accepted += 1
        return Admission.ACCEPTED

    def pop(self) -> Entry[T] | None:
        """The oldest entry, or None when empty."""
        if not self._queue:
            return None
        entry = self._queue.popleft()
        self._bytes -= entry.size_bytes
        return entry

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def counts(self) -> BufferCounts:
        return BufferCounts(self.accepted, self.duplicates, self.dropped, len(self._queue), self._bytes)
