"""The scheduler's worker list, read once and shared by what the gateway derives from it: the
context length it enforces (`contextlen.py`, every `context_refresh_s`) and its readiness
(`readiness.py`, on each /health probe).

A read reuses the latest list while it is younger than the caller's `max_age_s`, and concurrent
readers share one ListWorkers call, so a load balancer probing /health often costs the scheduler
at most one call per `max_age_s` beside the periodic read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from kvmesh.runtime.pb import common_pb2, scheduler_pb2

from .generation import SIDE_CALL_TIMEOUT_S

log = logging.getLogger(__name__)


def served_pool(reply: scheduler_pb2.ListWorkersResponse, pool: str) -> str:
    """The pool this gateway routes to: its own setting, else the mesh's production pool."""
    return pool or reply.production_pool or "production"


def live_decode_workers(reply: scheduler_pb2.ListWorkersResponse, pool: str | None = None) -> list[Any]:
    """The registered, non-draining decode workers of `reply` (of `pool` only, when given)."""
    return [w for w in reply.workers
            if w.role == common_pb2.WORKER_ROLE_DECODE and not w.draining and (pool is None or w.pool == pool)]


class WorkerList:
    """The latest ListWorkers reply of `backend`'s scheduler replicas; see the module docstring."""

    def __init__(self, backend: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.reply: scheduler_pb2.ListWorkersResponse | None = None  # None: the last read failed
        self.error = ""  # why the last read failed
        self._clock = clock
        self._read_at = float("-inf")
        self._reading: asyncio.Future[None] | None = None

    async def read(self, max_age_s: float = 0.0) -> scheduler_pb2.ListWorkersResponse | None:
        """The list, read again when the latest is older than `max_age_s`; None when that read failed."""
        if self._clock() - self._read_at > max_age_s:
            if self._reading is None:
                self._reading = asyncio.ensure_future(self._read())
            await asyncio.shield(self._reading)  # NOTE: one reader cancelled does not cancel the others' call
        return self.reply

    async def _read(self) -> None:
        """Ask the scheduler replicas in turn: the first whose list holds a live decode worker wins,
        so losing one replica does not fail /health (docs/replicas.md); else the last list read."""
        reply, error = None, ""
        try:
            for endpoint in self.backend.schedulers.endpoints:
                try:
                    reply = await self.backend.scheduler(endpoint).ListWorkers(
                        scheduler_pb2.ListWorkersRequest(), timeout=SIDE_CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    log.debug("worker list not read from %s: %s", endpoint, exc.code())
                    error = error or exc.code().name
                    continue
                if live_decode_workers(reply):
                    break
            self.reply, self.error = reply, "" if reply is not None else error
        finally:
            self._read_at = self._clock()
            self._reading = None
