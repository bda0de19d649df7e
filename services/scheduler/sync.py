"""Start-up sync of a scheduler replica: ask for the mesh's state instead of waiting for it.

A replica that starts (or restarts) serves gRPC at once but reports NOT_SERVING on health, and
answers Route only once synced (docs/replicas.md, "Start-up sync"):

1. it asks every worker and KV store to heartbeat now (`runtime.heartbeats`);
2. it asks a live peer replica which workers it hears (`kvmesh.schedulers.sync`, request/reply;
   the peer heartbeats at once too, so the pool split and the replica count arrive with it);
3. it is synced when it has registered every worker the peer listed, no worker's KV events are
   under repair (the replay or chunked full dump its first heartbeat started), and it has heard
   a peer; or when `timeout_s` passed. With no peer (no responder: a single replica, or the
   first of a fresh mesh) it waits `alone_s` for the heartbeats it asked for, then for their
   repairs, so a lone start-up costs `alone_s`, not a heartbeat period.

`missing()` is the pure part; `StartupSync` is the thin async shell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from kvmesh.runtime.bus import Bus, NoRespondersError
from kvmesh.runtime.errors import Unavailable
from kvmesh.runtime.heartbeats import request_heartbeats
from kvmesh.runtime.pb import events_pb2, scheduler_pb2

from .peers import SYNC_SUBJECT
from .replicas import ReplicaSet
from .router import Router

log = logging.getLogger(__name__)

FRESH_S = 1.5  # a worker the peer last heard longer ago than this may be gone: not waited for
POLL_S = 0.02


def missing(router: Router, expected: Iterable[str]) -> list[str]:
    """Workers not synced yet: expected but not registered, or registered with their KV events
    still under repair (every registered worker counts, expected or not)."""
    known = {w.worker_id for w in router.registry.all()}
    return sorted({w for w in expected if w not in known} | {w for w in known if router.index.repairing(w)})


@dataclass(slots=True)
class SyncResult:
    peer: bool              # a peer answered the sync request
    expected: int           # workers the peer listed
    waited_s: float
    timed_out: bool
    still_missing: list[str]


class StartupSync:
    """`await run()` once at start; `done` is set when synced (or timed out)."""

    def __init__(self, router: Router, bus: Bus, replicas: ReplicaSet, timeout_s: float = 3.0, alone_s: float = 0.2) -> None:
        self.router = router
        self.bus = bus
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.alone_s = alone_s
        self.done = asyncio.Event()

    async def run(self) -> SyncResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout_s
        await request_heartbeats(self.bus, self.replicas.self_id)
        expected = await self._ask_peer(min(1.0, self.timeout_s))
        peer = expected is not None
        if not peer:
            await asyncio.sleep(max(0.0, min(self.alone_s, deadline - loop.time())))
        while loop.time() < deadline:
            if not missing(self.router, expected or ()) and (not peer or self.replicas.count >= 2):
                break
            await asyncio.sleep(POLL_S)
        left = missing(self.router, expected or ())
        result = SyncResult(peer, len(expected or ()), loop.time() - started, bool(left) or (peer and self.replicas.count < 2), left)
        self.done.set()
        return result

    async def until_synced(self) -> None:
        """Route's gate: at once when synced; while syncing, UNAVAILABLE if a peer can take the
        request (the gateway asks the next replica), else wait for the sync (bounded)."""
        if self.done.is_set():
            return
        if self.replicas.count >= 2:
            raise Unavailable("this scheduler replica is still syncing; ask another")
        await self.done.wait()

    async def _ask_peer(self, timeout_s: float) -> list[str] | None:
        """The workers a live peer heard recently; None when no peer answered."""
        request = events_pb2.SchedulerHeartbeat(replica_id=self.replicas.self_id)
        try:
            reply = await self.bus.request(SYNC_SUBJECT, request, scheduler_pb2.ListWorkersResponse, timeout_s)
        except NoRespondersError:
            return None
        except Exception as exc:  # noqa: BLE001 - a peer that does not answer: sync as if alone
            log.warning("no answer to the sync request: %s", exc)
            return None
        return [w.worker_id for w in reply.workers if w.last_seen_age_s <= FRESH_S]
