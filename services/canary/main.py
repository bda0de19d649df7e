"""`kvmesh canary [flags]`: settings → service → serve until SIGTERM/SIGINT → graceful shutdown.
`kvmesh canary rollout start|status|abort` drives a running canary's automatic rollout."""

from __future__ import annotations

import asyncio

from kvmesh.runtime.config import settings_from_argv
from kvmesh.runtime.process import init_process, run_service
from kvmesh.runtime.shutdown import GracefulShutdown
from kvmesh.runtime.telemetry import Telemetry

from .config import CanarySettings
from .service import CanaryService


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "rollout":
        from .cli import rollout_main  # noqa: PLC0415

        return rollout_main(argv[1:])
    settings = settings_from_argv(CanarySettings, argv, "kvmesh canary")
    init_process(settings)
    run_service(serve(settings))
    return 0


async def serve(settings: CanarySettings, ready: asyncio.Event | None = None) -> None:
    telemetry = Telemetry("canary", settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    service = CanaryService(settings)
    shutdown = GracefulShutdown(grace_s=settings.grace_s)
    shutdown.install()
    await service.start()

    async def flush_telemetry() -> None:
        if telemetry is not None:
            telemetry.shutdown()

    shutdown.deregister.append(service.deregister)
    shutdown.drain.append(service.drain)
    shutdown.close.extend([service.close, flush_telemetry])
    if ready is not None:
        ready.set()
    await shutdown.wait()
    await shutdown.run()
