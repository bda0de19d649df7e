"""Readiness: the gateway can serve once a production decode worker is registered.

`/health` answers 503 until a scheduler replica lists at least one live, non-draining decode worker
in the pool this gateway routes to (the production pool unless `pool` is set), and again when
none is left, so a load balancer's probe never sends traffic that would get 503s. The list is
the one the context length watch reads (`workerlist.py`), reused for up to `HEALTH_MAX_AGE_S`.
"""

from __future__ import annotations

from kvmesh.runtime.pb import common_pb2

from .workerlist import WorkerList, served_pool

HEALTH_MAX_AGE_S = 1.0  # how stale a worker list /health may answer from


async def decode_workers_ready(workers: WorkerList, pool: str) -> tuple[bool, str]:
    """(ready, why not) from the scheduler's worker list (`pool`: this gateway's setting)."""
    reply = await workers.read(max_age_s=HEALTH_MAX_AGE_S)
    if reply is None:
        return False, f"scheduler unreachable ({workers.error})"
    pool = served_pool(reply, pool)
    live = [
        w for w in reply.workers
        if w.role == common_pb2.WORKER_ROLE_DECODE and w.pool == pool and not w.draining
    ]
    if not live:
        return False, f"no decode worker registered in pool {pool!r}"
    return True, ""
