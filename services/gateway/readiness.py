"""Readiness: the gateway can serve once a production decode worker is registered.

`/health` answers 503 until a scheduler replica lists at least one live, non-draining decode worker
in the pool this gateway routes to (the production pool unless `pool` is set), and again when
none is left, so a load balancer's probe never sends traffic that would get 503s.
"""

from __future__ import annotations

import grpc

from kvmesh.runtime.pb import common_pb2, scheduler_pb2

from .backend import Backend
from .generation import SIDE_CALL_TIMEOUT_S


async def decode_workers_ready(backend: Backend) -> tuple[bool, str]:
    """(ready, why not) from the scheduler replicas' worker lists: ready when any replica that
    answers lists one (so losing one replica does not fail the probe; docs/replicas.md)."""
    why = ""
    for endpoint in backend.schedulers.endpoints:
        try:
            reply = await backend.scheduler(endpoint).ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=SIDE_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            why = why or f"scheduler unreachable ({exc.code().name})"
            continue
        pool = backend.settings.pool or reply.production_pool
        live = [
            w for w in reply.workers
            if w.role == common_pb2.WORKER_ROLE_DECODE and w.pool == pool and not w.draining
        ]
        if live:
            return True, ""
        why = f"no decode worker registered in pool {pool!r}"
    return False, why
