"""NATS shell of pre-warming: asks each decode worker that joined to fetch the hottest prefixes
(`kvmesh.kv.prewarm.<worker_id>`, PrewarmRequest → PrewarmReply) and counts what it took."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter, Gauge, Histogram

from kvmesh.runtime.bus import KV_PREWARM_SUBJECT, Bus
from kvmesh.runtime.pb import events_pb2

from .prewarm import count_blocks
from .router import Router

log = logging.getLogger(__name__)

PREWARMS = Counter("kvmesh_scheduler_prewarms_total", "decode worker warm-ups, by outcome", ["outcome"])
PREWARM_BLOCKS = Counter("kvmesh_scheduler_prewarm_blocks_total", "KV blocks joining decode workers pre-warmed (now cached)")
PREWARM_SECONDS = Histogram("kvmesh_scheduler_prewarm_seconds", "time from a worker's registration plan to warm",
                            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
WARMING = Gauge("kvmesh_scheduler_prewarm_warming_workers", "decode workers fetching their pre-warm blocks now")
for _outcome in ("ok", "partial", "failed"):
    PREWARMS.labels(_outcome)


class PrewarmSender:
    """`kick()` (after each heartbeat and sweep) sends a request to every worker that joined; a
    worker that does not answer within `timeout_s` counts as warm (routing never waited on it)."""

    def __init__(self, router: Router, bus: Bus, timeout_s: float) -> None:
        self.router = router
        self.bus = bus
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task[None]] = set()

    def kick(self) -> None:
        for worker_id, prefixes in self.router.prewarm_plans():
            task = asyncio.create_task(self._prewarm(worker_id, prefixes), name=f"prewarm-{worker_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        WARMING.set(len(self.router.prewarm.warming) if self.router.prewarm else 0)

    async def _prewarm(self, worker_id: str, prefixes: list[tuple[bytes, ...]]) -> None:
        request = events_pb2.PrewarmRequest(
            prefixes=[events_pb2.PrewarmPrefix(block_hashes=p) for p in prefixes], num_blocks=count_blocks(prefixes)
        )
        log.info("pre-warming %s with %d blocks in %d prefixes", worker_id, request.num_blocks, len(prefixes))
        outcome, reply = "failed", None
        try:
            reply = await self.bus.request(KV_PREWARM_SUBJECT.format(worker_id=worker_id), request,
                                           events_pb2.PrewarmReply, self.timeout_s)
            complete = reply.blocks_cached >= reply.blocks_requested and not reply.error
            outcome = "ok" if complete else "partial" if reply.blocks_cached else "failed"
        except Exception as exc:  # noqa: BLE001 - the worker serves cold instead
            log.warning("pre-warming %s failed: %s", worker_id, exc or type(exc).__name__)
        prewarm = self.router.prewarm
        seconds = prewarm.done(worker_id, self.router.registry.clock()) if prewarm else None
        PREWARMS.labels(outcome).inc()
        if reply is not None:
            PREWARM_BLOCKS.inc(reply.blocks_cached)
            log.info("%s warm: %d/%d blocks cached in %.2f s%s", worker_id, reply.blocks_cached, reply.blocks_requested,
                     reply.seconds, f" ({reply.error})" if reply.error else "")
        if seconds is not None:
            PREWARM_SECONDS.observe(seconds)
        WARMING.set(len(prewarm.warming) if prewarm else 0)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

