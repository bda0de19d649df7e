"""Heartbeats on request: a scheduler replica that starts asks every publisher to beat now.

`kvmesh.workers.heartbeat.request` (payload: the asking replica's `SchedulerHeartbeat`, informative
only). Every worker and KV store that heartbeats answers by publishing its ordinary heartbeat at
once on its own subject, so a replica that (re)starts knows the mesh within a round trip instead of
within a heartbeat period (docs/replicas.md, "Start-up sync"). A publisher beats at most once per
`min_gap_s` on request, so a burst of requests costs one extra beat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from .bus import HEARTBEAT_REQUEST_SUBJECT, Bus
from .pb import events_pb2

log = logging.getLogger(__name__)


async def beat_on_request(bus: Bus, beat: Callable[[], Awaitable[None]], min_gap_s: float = 0.1) -> None:
    """Subscribes so that `beat()` runs whenever a scheduler replica asks (rate-limited)."""
    last = -min_gap_s

    async def on_request(_request: events_pb2.SchedulerHeartbeat, _msg) -> None:  # noqa: ANN001
        nonlocal last
        now = time.monotonic()
        if now - last < min_gap_s:
            return
        last = now
        await beat()

    await bus.subscribe(HEARTBEAT_REQUEST_SUBJECT, events_pb2.SchedulerHeartbeat, on_request)


async def request_heartbeats(bus: Bus, replica_id: str) -> None:
    """Asks every worker and KV store to heartbeat now (fire-and-forget)."""
    try:
        await bus.publish(HEARTBEAT_REQUEST_SUBJECT, events_pb2.SchedulerHeartbeat(replica_id=replica_id, timestamp=time.time()))
    except Exception as exc:  # noqa: BLE001 - NATS away: the periodic heartbeats still come
        log.warning("could not ask the workers for heartbeats: %s", exc)
