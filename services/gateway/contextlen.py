"""The context length the gateway advertises (/v1/models) and enforces: what the workers report.

Workers put their engine's real `max_model_len` (sized from the device's memory) in their
heartbeats; the scheduler keeps it per worker and lists it. The gateway reads that list
(`workerlist.py`, shared with readiness) every `context_refresh_s` and
uses the smallest value among the live workers of the pool it routes to, capped by its own
setting (or the checkpoint's `max_position_embeddings`). Until a worker has reported, the cap
alone applies; an engine still refuses what it cannot hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kvmesh.runtime.pb import scheduler_pb2

from .prompt import ServedModel
from .workerlist import WorkerList, served_pool

log = logging.getLogger(__name__)


def reported_max_model_len(reply: scheduler_pb2.ListWorkersResponse, pool: str) -> int | None:
    """The smallest max_model_len among live workers of `pool` (empty = the production pool)."""
    pool = served_pool(reply, pool)
    lens = [w.max_model_len for w in reply.workers if w.pool == pool and not w.draining and w.max_model_len > 0]
    return min(lens) if lens else None


class ContextLengthWatch:
    """Keeps `model.max_model_len` at min(cap, what the workers report), refreshed every `interval_s`."""

    def __init__(self, workers: WorkerList, model: ServedModel, pool: str, interval_s: float) -> None:
        self.workers = workers
        self.model = model
        self.cap = model.max_model_len
        self.pool = pool
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    async def refresh(self) -> None:
        reply = await self.workers.read()
        if reply is None:  # the scheduler is unreachable: keep what we have
            return
        reported = reported_max_model_len(reply, self.pool)
        value = self.cap if reported is None else min(self.cap, reported)
        if value != self.model.max_model_len:
            log.info("max_model_len is now %d (cap %d, workers report %s)", value, self.cap, reported)
            self.model.max_model_len = value

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="context-length-watch")

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
