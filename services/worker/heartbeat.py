"""A worker's heartbeat on NATS: who it is, where it listens, how loaded it is."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmesh.runtime.bus import HEARTBEAT_SUBJECT, Bus
from kvmesh.runtime.heartbeats import beat_on_request
from kvmesh.runtime.pb import common_pb2, events_pb2

log = logging.getLogger(__name__)
ROLES = {"prefill": common_pb2.WORKER_ROLE_PREFILL, "decode": common_pb2.WORKER_ROLE_DECODE}


@dataclass(slots=True)
class HeartbeatInfo:
    """The static part of a worker's heartbeat."""

    worker_id: str
    role: str
    endpoint: str
    pool: str
    model: str
    block_size: int
    max_num_seqs: int
    started_at: float
    max_model_len: int = 0  # the engine's real context length


class Heartbeater:
    """Publishes a Heartbeat every `interval_s`, right after a NATS reconnect, and when a
    scheduler replica asks (`runtime.heartbeats`)."""

    def __init__(
        self, bus: Bus | None, info: HeartbeatInfo, stats: Callable[[], Any], interval_s: float,
        kv_event_seq: Callable[[], int] = lambda: 0, live_requests: Callable[[], list[str]] | None = None,
        progress: Callable[[], int] | None = None,
    ) -> None:
        self.bus = bus
        self.info = info
        self.draining = False
        self._stats = stats
        self._kv_event_seq = kv_event_seq
        self._live_requests = live_requests  # None = not reported (a prefill worker)
        self._progress = progress  # engine steps that advanced a request; None = not reported
        self._interval_s = interval_s
        self._task: asyncio.Task | None = None
        self.subject = HEARTBEAT_SUBJECT.format(role=info.role, worker_id=info.worker_id)

    def message(self) -> events_pb2.Heartbeat:
        s, i = self._stats(), self.info
        hb = events_pb2.Heartbeat(
            worker_id=i.worker_id, role=ROLES[i.role], endpoint=i.endpoint, pool=i.pool, model=i.model,
            block_size=i.block_size, num_running=s.num_running, num_waiting=s.num_waiting,
            kv_blocks_total=s.num_total_blocks, kv_blocks_free=s.num_free_blocks, max_num_seqs=i.max_num_seqs,
            timestamp=time.time(), started_at=i.started_at, draining=self.draining, kv_event_seq=self._kv_event_seq(),
            max_model_len=i.max_model_len,
        )
        if self._progress is not None:
            hb.engine_progress, hb.reports_progress = self._progress(), True
        if self._live_requests is not None:  # NOTE: set even when empty: "holds nothing" (S16)
            hb.live_requests.SetInParent()
            hb.live_requests.request_ids.extend(self._live_requests())
        return hb

    async def beat(self) -> None:
        if self.bus is None:
            return
        try:
            await self.bus.publish(self.subject, self.message())
        except Exception as exc:  # noqa: BLE001 - NATS away: the next beat tries again
            log.debug("heartbeat not sent: %s", exc)

    def start(self) -> None:
        if self.bus is None:
            return
        self.bus.on_reconnect(self.beat)
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def _run(self) -> None:
        try:
            await beat_on_request(self.bus, self.beat)
        except Exception as exc:  # noqa: BLE001 - the periodic beat still runs
            log.warning("not answering heartbeat requests: %s", exc)
        while True:
            await self.beat()
            await asyncio.sleep(self._interval_s)

    async def deregister(self) -> None:
        """Announce draining (the scheduler stops routing here) and stop the periodic beat."""
        self.draining = True
        if self._task is not None:
            self._task.cancel()
        await self.beat()
