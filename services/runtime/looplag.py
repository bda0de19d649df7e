"""How late an event loop runs what is due: a task sleeps `interval_s` and records how much later
than that it woke.

That delay is what any ready callback waited behind the others (a request's parsing, an SSE
write, a first token's hand-off), plus the loop's wait for a CPU on a busy host. Its floor is
the timer's resolution (uvloop: ~1 ms). Why (issue 20): under the fidelity trace a client's TTFT
ran 13-45 ms over the gateway's own, and nothing in the mesh said where the gap was.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopLag:
    """Observes the loop's lag every `interval_s` into `observe` (seconds) while started."""

    def __init__(self, observe: Callable[[float], None], interval_s: float = 0.1) -> None:
        self.observe = observe
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-loop-lag")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.observe(max(0.0, time.perf_counter() - due))
