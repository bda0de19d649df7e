"""Publisher side of the KV events contract (`kvmesh.kv.events.<worker_id>`).

`KvEventLog` is the pure core: it numbers batches (seq starts at 1, +1 per batch), keeps a
bounded ring of recent batches and answers replay requests, either with the missing batches or
with a full dump of the held set when they have left the ring. `KvEventPublisher` is the thin
NATS shell around it that workers and the kvstore use.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from .bus import KV_EVENTS_SUBJECT, KV_REPLAY_SUBJECT, Bus
from .pb import events_pb2

log = logging.getLogger(__name__)

HeldFn = Callable[[], Iterable[bytes]]


def stored(block_hashes: Sequence[bytes], parent_hash: bytes | None = None) -> events_pb2.KvEvent:
    """A BlockStored event: `block_hashes` in chain order, `parent_hash` None for a first block."""
    return events_pb2.KvEvent(stored=events_pb2.BlockStored(block_hashes=list(block_hashes), parent_hash=parent_hash or b""))


def removed(block_hashes: Sequence[bytes]) -> events_pb2.KvEvent:
    return events_pb2.KvEvent(removed=events_pb2.BlockRemoved(block_hashes=list(block_hashes)))


def cleared() -> events_pb2.KvEvent:
    return events_pb2.KvEvent(cleared=events_pb2.AllCleared())


class KvEventLog:
    """Numbers KV event batches and remembers the last `ring_size` of them for replays.

    `held` returns the complete set of block hashes the publisher holds right now; it is only
    called when a replay asks for batches that already left the ring.
    """

    def __init__(self, worker_id: str, held: HeldFn, ring_size: int = 1024, clock: Callable[[], float] = time.time) -> None:
        if ring_size < 1:
            raise ValueError("ring_size must be >= 1")
        self.worker_id = worker_id
        self._held = held
        self._clock = clock
        self._ring: deque[events_pb2.KvEventBatch] = deque(maxlen=ring_size)
        self.seq = 0

    def append(self, events: Sequence[events_pb2.KvEvent]) -> events_pb2.KvEventBatch:
        """The next batch (seq + 1) holding `events`; it is also kept for replays."""
        self.seq += 1
        batch = events_pb2.KvEventBatch(worker_id=self.worker_id, seq=self.seq, timestamp=self._clock(), events=list(events))
        self._ring.append(batch)
        return batch

    def replay(self, from_seq: int) -> events_pb2.KvReplayReply:
        """Batches `from_seq..seq` when all are still in the ring, else a full dump at `seq`."""
        from_seq = max(1, from_seq)
        if from_seq > self.seq:
            return events_pb2.KvReplayReply(seq=self.seq)
        oldest = self._ring[0].seq if self._ring else self.seq + 1
        if from_seq >= oldest:
            return events_pb2.KvReplayReply(batches=[b for b in self._ring if b.seq >= from_seq], seq=self.seq)
        return events_pb2.KvReplayReply(full_dump=True, held=list(self._held()), seq=self.seq)


class KvEventPublisher:
    """Publishes a worker's KV event batches on NATS and answers replay requests.

    `await KvEventPublisher.start(bus, worker_id, held)`, then `await publish([stored(...), ...])`.
    """

    def __init__(self, bus: Bus, log_: KvEventLog) -> None:
        self.bus = bus
        self.log = log_
        self._subscription = None

    @classmethod
    async def start(cls, bus: Bus, worker_id: str, held: HeldFn, ring_size: int = 1024) -> KvEventPublisher:
        publisher = cls(bus, KvEventLog(worker_id, held, ring_size))
        publisher._subscription = await bus.client.subscribe(
            KV_REPLAY_SUBJECT.format(worker_id=worker_id), cb=publisher._on_replay
        )
        return publisher

    @property
    def seq(self) -> int:
        """Last sequence number published (heartbeats carry it as `kv_event_seq`)."""
        return self.log.seq

    async def publish(self, events: Sequence[events_pb2.KvEvent]) -> None:
        if not events:
            return
        batch = self.log.append(events)
        try:
            await self.bus.publish(KV_EVENTS_SUBJECT.format(worker_id=self.log.worker_id), batch)
        except Exception as exc:  # noqa: BLE001 - subscribers repair the gap by replay
            log.warning("KV event batch %d not published: %s", batch.seq, exc)

    async def _on_replay(self, msg) -> None:  # noqa: ANN001 - nats Msg
        request = events_pb2.KvReplayRequest()
        try:
            request.ParseFromString(msg.data)
        except Exception:  # noqa: BLE001 - malformed request: answer with nothing
            return
        if msg.reply:
            await msg.respond(self.log.replay(request.from_seq).SerializeToString())

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
