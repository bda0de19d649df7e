"""One graceful-shutdown helper for every service.

On SIGTERM or SIGINT: mark not serving and deregister, let in-flight work drain for a grace
period, then stop servers, close the bus and flush telemetry - in that order.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class GracefulShutdown:
    """`await shutdown.wait()` until a signal; then `await shutdown.run()` runs the phases."""

    grace_s: float = 10.0
    deregister: list[Step] = field(default_factory=list)
    drain: list[Callable[[float], Awaitable[None]]] = field(default_factory=list)
    close: list[Step] = field(default_factory=list)
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.trigger)

    def trigger(self) -> None:
        self._event.set()

    @property
    def triggered(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    async def run(self) -> None:
        for step in self.deregister:
            await _safely(step())
        deadline = asyncio.get_running_loop().time() + self.grace_s
        for drain in self.drain:
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            await _safely(asyncio.wait_for(drain(remaining), timeout=remaining + 1.0))
        for step in self.close:
            await _safely(step())


async def _safely(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - shutdown goes on whatever one step does
        log.exception("shutdown step failed")
