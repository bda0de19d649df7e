"""Readiness: the gateway can serve once a production decode worker is registered.

`/health` answers 503 until the scheduler lists at least one live, non-draining decode worker
in the pool this gateway routes to (the production pool unless `pool` is set), and again when
none is left, so a load balancer's probe never sends traffic that would get 503s. The list is
the one the context length watch reads (`workerlist.py`), reused for up to `HEALTH_MAX_AGE_S`.
"""

from __future__ import annotations

from .workerlist import WorkerList, live_decode_workers, served_pool

HEALTH_MAX_AGE_S = 1.0  # how stale a worker list /health may answer from


async def decode_workers_ready(workers: WorkerList, pool: str) -> tuple[bool, str]:
    """(ready, why not) from the scheduler replicas' worker list (`pool`: this gateway's setting)."""
    reply = await workers.read(max_age_s=HEALTH_MAX_AGE_S)
    if reply is None:
        return False, f"scheduler unreachable ({workers.error})"
    pool = served_pool(reply, pool)
    if not live_decode_workers(reply, pool):
        return False, f"no decode worker registered in pool {pool!r}"
    return True, ""
