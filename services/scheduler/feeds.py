"""NATS shell: heartbeats and KV events into the router, gap repair by replay, liveness sweeps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kvmesh.runtime.bus import HEARTBEAT_WILDCARD, KV_EVENTS_WILDCARD, KV_REPLAY_SUBJECT, Bus
from kvmesh.runtime.kvevents import fetch_dump
from kvmesh.runtime.pb import events_pb2

from .events import batch_from_pb, heartbeat_from_pb, replay_from_pb
from .router import Router

log = logging.getLogger(__name__)

REPLAY_ATTEMPTS = 3


def sweep_interval(heartbeat_timeout_s: float) -> float:
    """How often the registry is swept for silent workers: a sixth of the heartbeat timeout, at most
    0.5 s (the default 3 s timeout: 0.5 s, so a worker is dropped 3.0-3.5 s after its last beat).

    NOTE: it was a fixed 0.2 s: 5 of the idle scheduler's ~13 wake-ups a second (each one a sweep
    and a refresh of gauges and admission), where heartbeats already refresh those twice a second
    a worker."""
    return min(0.5, heartbeat_timeout_s / 6)


class BusFeeds:
    """Feeds the router from NATS. `on_change()` runs after heartbeats, repairs and each sweep
    (every `sweep_interval_s`), so gauges and admission capacity follow within that period."""

    def __init__(self, router: Router, bus: Bus, on_change: Callable[[], None], replay_timeout_s: float = 2.0) -> None:
        self.router = router
        self.bus = bus
        self.on_change = on_change
        self.replay_timeout_s = replay_timeout_s
        self._repairs: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, sweep_interval_s: float = 0.5) -> None:
        await self.bus.subscribe(HEARTBEAT_WILDCARD, events_pb2.Heartbeat, self._on_heartbeat)
        await self.bus.subscribe(KV_EVENTS_WILDCARD, events_pb2.KvEventBatch, self._on_batch)
        self._sweeper = asyncio.create_task(self._sweep_loop(sweep_interval_s))
        self.bus.on_reconnect(self._on_reconnect)

    async def _on_reconnect(self) -> None:
        self.router.registry.grace()

    async def stop(self) -> None:
        tasks = [t for t in (self._sweeper, *self._repairs.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_heartbeat(self, hb: events_pb2.Heartbeat, _msg) -> None:  # noqa: ANN001
        info = heartbeat_from_pb(hb)
        is_new = self.router.registry.get(info.worker_id) is None
        from_seq = self.router.observe_heartbeat(info)
        if is_new:
            log.info("worker %s (%s) joined at %s", info.worker_id, info.role.name.lower(), info.endpoint)
        self.on_change()
        if from_seq is not None:
            self._repair(info.worker_id, from_seq)

    async def _on_batch(self, batch: events_pb2.KvEventBatch, msg) -> None:  # noqa: ANN001
        worker_id = batch.worker_id or msg.subject.rsplit(".", 1)[-1]
        from_seq = self.router.index.apply(batch_from_pb(batch, worker_id))
        if from_seq is not None:
            self._repair(worker_id, from_seq)

    def _repair(self, worker_id: str, from_seq: int) -> None:
        if worker_id not in self._repairs:
            task = asyncio.create_task(self._replay(worker_id, from_seq))
            self._repairs[worker_id] = task
            task.add_done_callback(lambda _t: self._repairs.pop(worker_id, None))

    async def _replay(self, worker_id: str, from_seq: int) -> None:
        index = self.router.index
        subject = KV_REPLAY_SUBJECT.format(worker_id=worker_id)

        async def request(message: events_pb2.KvReplayRequest) -> events_pb2.KvReplayReply:
            return await self.bus.request(subject, message, events_pb2.KvReplayReply, self.replay_timeout_s)

        for _ in range(REPLAY_ATTEMPTS):
            try:
                reply = await fetch_dump(await request(events_pb2.KvReplayRequest(from_seq=from_seq)), request)
            except Exception as exc:  # noqa: BLE001 - retried, then given up
                log.warning("KV replay from %s (seq %d) failed: %s", worker_id, from_seq, exc)
                continue
            if not index.repairing(worker_id):
                return  # the worker was dropped meanwhile
            next_from = index.apply_replay(worker_id, replay_from_pb(reply, worker_id))
            self.on_change()
            if next_from is None:
                return
            from_seq = next_from
        if index.repairing(worker_id):
            log.warning("giving up KV replay from %s; forgetting its blocks", worker_id)
            index.abandon_repair(worker_id)
            self.on_change()

    async def _sweep_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if not self.bus.connected:
                # NOTE: while NATS is away we hear no heartbeats; evicting on that silence would
                # drop every worker during a short blip. Serve on what we know instead.
                continue
            for worker_id in self.router.sweep():
                log.info("worker %s gone (no heartbeat for %.1fs)", worker_id, self.router.registry.heartbeat_timeout_s)
            self.on_change()
