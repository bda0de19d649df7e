"""The process shell both workers share: telemetry, NATS, start, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .bus import Bus
from .config import settings_from_argv
from .shutdown import GracefulShutdown
from .telemetry import Telemetry
from .worker import WorkerSettings

log = logging.getLogger(__name__)
S = TypeVar("S", bound=WorkerSettings)


async def serve_worker(
    role: str, settings: S, start: Callable[[S, Bus | None], Awaitable[Any]], ready: asyncio.Event | None = None
) -> None:
    """Runs one worker until SIGTERM/SIGINT: deregister, drain in-flight work for `drain_grace_s`,
    close the app and NATS, flush telemetry. `start(settings, bus)` returns the app, which has
    `deregister()`, `close()` and `worker.drain(grace_s)`."""
    telemetry = Telemetry(role, settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    bus = await Bus.connect(settings.nats_url, f"{role}-{settings.worker_id or 'worker'}") if settings.nats_url else None
    app = await start(settings, bus)

    async def flush_telemetry() -> None:
        if telemetry is not None:
            await asyncio.to_thread(telemetry.shutdown)

    shutdown = GracefulShutdown(
        grace_s=settings.drain_grace_s,
        deregister=[app.deregister],
        drain=[app.worker.drain],
        close=[app.close, *([bus.close] if bus else []), flush_telemetry],
    )
    shutdown.install()
    if ready is not None:
        ready.set()
    await shutdown.wait()
    log.info("%s worker shutting down", role)
    await shutdown.run()


def worker_main(
    role: str, settings_cls: type[S], argv: Sequence[str] | None, serve: Callable[[S], Awaitable[None]]
) -> int:
    settings = settings_from_argv(settings_cls, argv, f"kvmesh {role}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(settings))
    return 0
