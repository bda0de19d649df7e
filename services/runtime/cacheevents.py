"""KV events for a worker's prefix cache: BlockStored / BlockRemoved on `kvmesh.kv.events.<id>`.

NOTE: needs the engine hook `take_kv_events() -> list[(kind, block_hashes, parent_hash)]` with
kind "stored" | "removed" | "cleared", drained on the engine thread after each step. An engine
without it publishes nothing (the scheduler then routes on heartbeats alone).

Events are coalesced: the steps' events collect (in order) and go out as ONE batch at most every
`flush_interval_s`, with one hand-over from the engine thread per batch, not per step. On a small
model a step takes about a millisecond and nearly every step completes a block somewhere, so a
batch per step was a NATS message per step for the worker to send and the scheduler to parse.
Routing sees a block at most `flush_interval_s` late.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from . import kvevents
from .bus import Bus
from .kvevents import KvEventPublisher

if TYPE_CHECKING:  # NOTE: the worker framework sits above runtime; only its type is named here.
    from kvmesh.worker.worker import EngineLoop

log = logging.getLogger(__name__)


class CacheEvents:
    """Forwards the engine's cache movements to a KvEventPublisher; mirrors the held set for dumps."""

    def __init__(self, loop: EngineLoop, flush_interval_s: float = 0.02) -> None:
        self.loop = loop
        self.flush_interval_s = flush_interval_s
        self.held: dict[bytes, None] = {}
        self.publisher: KvEventPublisher | None = None
        self._lock = threading.Lock()
        self._pending: list = []  # events of steps not yet published, in order
        self._flushing = False  # a flush is scheduled on the event loop

    @property
    def seq(self) -> int:
        return self.publisher.seq if self.publisher else 0

    async def start(self, bus: Bus | None, worker_id: str) -> bool:
        if bus is None or not hasattr(self.loop.engine, "take_kv_events"):
            return False
        self.publisher = await KvEventPublisher.start(bus, worker_id, lambda: list(self.held))
        self.loop.step_hooks.append(self._on_step)
        return True

    def _on_step(self, engine, outputs) -> None:  # engine thread
        events = engine.take_kv_events()
        if not events:
            return
        with self._lock:
            self._pending += events
            if self._flushing:
                return
            self._flushing = True
        self.loop.post(self._schedule_flush)

    def _schedule_flush(self) -> None:  # event loop
        asyncio.get_running_loop().call_later(self.flush_interval_s, self._flush)

    def _flush(self) -> None:  # event loop
        with self._lock:
            events, self._pending, self._flushing = self._pending, [], False
        self._publish(events)

    def _publish(self, events) -> None:  # event loop
        pb = []
        for kind, hashes, parent in events:
            if kind == "stored":
                self.held.update(dict.fromkeys(hashes))
                pb.append(kvevents.stored(hashes, parent))
            elif kind == "removed":
                for h in hashes:
                    self.held.pop(h, None)
                pb.append(kvevents.removed(hashes))
            elif kind == "cleared":
                self.held.clear()
                pb.append(kvevents.cleared())
        asyncio.create_task(self.publisher.publish(pb))

    async def close(self) -> None:
        if self.publisher is not None:
            await self.publisher.close()
