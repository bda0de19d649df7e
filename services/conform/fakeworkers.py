"""Fake workers on NATS for the scheduler suite: heartbeats, KV event batches, replay answers."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from kvmesh.runtime.bus import HEARTBEAT_SUBJECT, KV_EVENTS_SUBJECT, KV_REPLAY_SUBJECT, Bus
from kvmesh.runtime.pb import common_pb2, events_pb2

ROLE_NAMES = {common_pb2.WORKER_ROLE_PREFILL: "prefill", common_pb2.WORKER_ROLE_DECODE: "decode"}


@dataclass(slots=True)
class FakeWorker:
    """One worker that exists only as heartbeats and KV events. `replies` answers replay
    requests in order (the last one repeats); `replay_requests` records every from_seq asked."""

    bus: Bus
    worker_id: str
    role: int
    pool: str
    model: str
    block_size: int
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    kv_event_seq: int = 0
    max_num_seqs: int = 8
    live: list[str] | None = None     # request ids it reports holding (None: not reported)
    replies: list[events_pb2.KvReplayReply] = field(default_factory=list)
    replay_requests: list[int] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _sub: object = None

    @property
    def running(self) -> bool:
        """True while it heartbeats (started and not stopped)."""
        return self._task is not None

    @property
    def endpoint(self) -> str:
        return f"conform.invalid:{abs(hash(self.worker_id)) % 60000 + 1024}"

    def heartbeat(self) -> events_pb2.Heartbeat:
        hb = events_pb2.Heartbeat(
            worker_id=self.worker_id, role=self.role, endpoint=self.endpoint, pool=self.pool, model=self.model,
            block_size=self.block_size, kv_blocks_total=1000, kv_blocks_free=1000, max_num_seqs=self.max_num_seqs,
            timestamp=time.time(), started_at=self.started_at, draining=self.draining, kv_event_seq=self.kv_event_seq,
        )
        if self.live is not None:
            hb.live_requests.request_ids.extend(self.live)
        return hb

    async def beat(self) -> None:
        subject = HEARTBEAT_SUBJECT.format(role=ROLE_NAMES[self.role], worker_id=self.worker_id)
        await self.bus.publish(subject, self.heartbeat())

    async def start(self, interval_s: float = 0.3) -> None:
        async def on_replay(msg) -> None:  # noqa: ANN001 - nats Msg
            request = events_pb2.KvReplayRequest()
            request.ParseFromString(msg.data)
            self.replay_requests.append(request.from_seq)
            if self.replies and msg.reply:
                reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
                await msg.respond(reply.SerializeToString())

        self._sub = await self.bus.client.subscribe(KV_REPLAY_SUBJECT.format(worker_id=self.worker_id), cb=on_replay)
        await self.beat()
        self._task = asyncio.create_task(self._run(interval_s))

    async def _run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.beat()

    async def publish(self, seq: int, *events: events_pb2.KvEvent) -> events_pb2.KvEventBatch:
        batch = batch_of(self.worker_id, seq, *events)
        self.kv_event_seq = max(self.kv_event_seq, seq)
        await self.bus.publish(KV_EVENTS_SUBJECT.format(worker_id=self.worker_id), batch)
        return batch

    async def stop(self) -> None:
        """Heartbeats stop (the worker vanishes without a word)."""
        if self._task:
            self._task.cancel()
            self._task = None
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


def batch_of(worker_id: str, seq: int, *events: events_pb2.KvEvent) -> events_pb2.KvEventBatch:
    return events_pb2.KvEventBatch(worker_id=worker_id, seq=seq, timestamp=time.time(), events=list(events))


def stored(hashes: list[bytes], parent: bytes = b"") -> events_pb2.KvEvent:
    return events_pb2.KvEvent(stored=events_pb2.BlockStored(block_hashes=hashes, parent_hash=parent))
