"""`kvmesh gateway`: build settings, serve HTTP with uvicorn, shut down gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from kvmesh.runtime.config import settings_from_argv
from kvmesh.runtime.process import init_process, run_service
from kvmesh.runtime.shutdown import GracefulShutdown
from kvmesh.runtime.telemetry import Telemetry

from .backend import Backend
from .config import GatewaySettings
from .prompt import ServedModel
from .server import create_app
from .streaming import RawSend

log = logging.getLogger("kvmesh.gateway")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: GracefulShutdown owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bound_port(server: uvicorn.Server) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


def build_server(settings: GatewaySettings) -> _Server:
    """A uvicorn server for the gateway app (not started)."""
    model = ServedModel.load(settings)
    backend = Backend(settings, model.hasher, model.tokenizer.eos_token_ids, model.tokenizer)
    app = create_app(settings, backend, model=model)
    config = uvicorn.Config(
        RawSend(app),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_s)),
        lifespan="on",
        http="auto",  # NOTE: httptools (a dependency) when installed: far cheaper per SSE send than h11
    )
    return _Server(config)


async def serve(settings: GatewaySettings, ready: asyncio.Event | None = None) -> None:
    """Serves until SIGTERM/SIGINT; in-flight requests get `shutdown_grace_s` to finish."""
    telemetry = Telemetry("gateway", settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    server = build_server(settings)
    shutdown = GracefulShutdown(grace_s=settings.shutdown_grace_s)
    shutdown.install()
    task = asyncio.create_task(server.serve())
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if task.done():
            task.result()
            raise RuntimeError(f"gateway could not start on {settings.host}:{settings.port}")
        log.info("gateway serving %s on http://%s:%d", settings.served_model_name(), settings.host, bound_port(server))
        if ready is not None:
            ready.set()
        waiter = asyncio.create_task(shutdown.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if telemetry is not None:
            telemetry.shutdown()


def main(argv: list[str] | None = None) -> int:
    settings = settings_from_argv(GatewaySettings, argv, prog="kvmesh gateway")
    init_process(settings)
    run_service(serve(settings))
    return 0
