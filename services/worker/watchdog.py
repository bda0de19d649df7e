"""The engine watchdog: no step progress while work is pending means the engine is stuck.

A stuck engine (a hung kernel, a deadlock, a step that never returns) used to stay routable:
its heartbeat kept publishing the last stats and gRPC health said SERVING. `watch_engine` checks
the `EngineLoop` every `interval_s`; once it has had work pending and advanced no request for
`stall_s`, it calls `on_stall` once (the worker app deregisters: NOT_SERVING health, a draining
heartbeat, new requests refused) and ends. The heartbeat also carries `engine_progress`, so the
scheduler stops routing to a stalled worker even when this watchdog cannot run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


def stalled(loop: Any, stall_s: float, now: float) -> bool:
    """True when `loop` (an EngineLoop) has work and no step advanced a request for `stall_s`."""
    return bool(loop.has_work) and now - loop.progress_at > stall_s


async def watch_engine(
    loop: Any, stall_s: float, on_stall: Callable[[], Awaitable[None]], interval_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Runs until the engine stalls, then `await on_stall()` once; see the module docstring."""
    while True:
        await asyncio.sleep(interval_s)
        if stalled(loop, stall_s, clock()):
            log.error("engine made no progress for %.1f s with work pending; deregistering", clock() - loop.progress_at)
            await on_stall()
            return
