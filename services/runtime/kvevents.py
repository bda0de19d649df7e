"""Publisher side of the KV events contract (`kvmesh.kv.events.<worker_id>`).

`KvEventLog` is the pure core: it numbers batches (seq starts at 1, +1 per batch), keeps a
bounded ring of recent batches and answers replay requests, either with the missing batches or
with a full dump of the held set when they have left the ring. A full dump goes out in chunks of
`dump_chunk` hashes (NATS refuses messages over 1 MiB: one message held ~30k hashes); the
subscriber fetches chunks 1.. by the dump's id (`fetch_dump`). `KvEventPublisher` is the thin
NATS shell around it that workers and the kvstore use.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence

from .bus import KV_EVENTS_SUBJECT, KV_REPLAY_SUBJECT, Bus
from .pb import events_pb2

log = logging.getLogger(__name__)

HeldFn = Callable[[], Iterable[bytes]]
RequestFn = Callable[[events_pb2.KvReplayRequest], Awaitable[events_pb2.KvReplayReply]]

DUMP_CHUNK = 16_384      # hashes per dump chunk: 16k x (32 + 2) bytes ≈ 560 KB, under NATS's 1 MiB
DUMPS_KEPT = 4           # recent dumps kept for chunk requests (each is a snapshot at its seq)


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

    def __init__(
        self, worker_id: str, held: HeldFn, ring_size: int = 1024, clock: Callable[[], float] = time.time,
        dump_chunk: int = DUMP_CHUNK,
    ) -> None:
        if ring_size < 1 or dump_chunk < 1:
            raise ValueError("ring_size and dump_chunk must be >= 1")
        self.worker_id = worker_id
        self._held = held
        self._clock = clock
        self._ring: deque[events_pb2.KvEventBatch] = deque(maxlen=ring_size)
        self._dump_chunk = dump_chunk
        self._dumps: dict[str, tuple[int, list[bytes]]] = {}  # dump_id -> (seq, held snapshot)
        self._dump_count = 0
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
        self._dump_count += 1
        dump_id = f"{self.worker_id}/{self._dump_count}"
        self._dumps[dump_id] = (self.seq, list(self._held()))
        while len(self._dumps) > DUMPS_KEPT:
            del self._dumps[next(iter(self._dumps))]
        return self.dump_chunk(dump_id, 0)

    def dump_chunk(self, dump_id: str, chunk: int) -> events_pb2.KvReplayReply:
        """Chunk `chunk` of a dump made by `replay`; an empty reply (seq 0) when it is gone."""
        found = self._dumps.get(dump_id)
        if found is None:
            return events_pb2.KvReplayReply()
        seq, held = found
        size = self._dump_chunk
        num_chunks = max(1, -(-len(held) // size))
        if chunk >= num_chunks:
            return events_pb2.KvReplayReply()
        return events_pb2.KvReplayReply(
            full_dump=True, held=held[chunk * size : (chunk + 1) * size], seq=seq,
            dump_id=dump_id, chunk=chunk, num_chunks=num_chunks,
        )


async def fetch_dump(first: events_pb2.KvReplayReply, request: RequestFn) -> events_pb2.KvReplayReply:
    """The whole dump whose first chunk is `first`: asks for chunks 1.. and joins them.
    Raises ValueError when the publisher no longer has the dump (the caller asks again)."""
    if not first.full_dump or first.num_chunks <= 1:
        return first
    held = list(first.held)
    for chunk in range(1, first.num_chunks):
        reply = await request(events_pb2.KvReplayRequest(dump_id=first.dump_id, chunk=chunk))
        if reply.dump_id != first.dump_id or reply.chunk != chunk or reply.seq != first.seq:
            raise ValueError(f"dump {first.dump_id} chunk {chunk} is gone")
        held.extend(reply.held)
    return events_pb2.KvReplayReply(full_dump=True, held=held, seq=first.seq, dump_id=first.dump_id, num_chunks=1)


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
        if not msg.reply:
            return
        if request.dump_id:
            reply = self.log.dump_chunk(request.dump_id, request.chunk)
        else:
            reply = self.log.replay(request.from_seq)
        await msg.respond(reply.SerializeToString())

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
