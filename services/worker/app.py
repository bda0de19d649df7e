"""What both workers share around their servicer: engine start, announcing on NATS, and the
process shell (telemetry, NATS, graceful shutdown)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvmesh.runtime import kvwire
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.cacheevents import CacheEvents
from kvmesh.runtime.config import settings_from_argv
from kvmesh.runtime.grpcutil import ChannelPool, GrpcServer, TlsConfig
from kvmesh.runtime.heap import fix_mmap_threshold, trim_heap
from kvmesh.runtime.process import apply_cpus, init_process, run_service
from kvmesh.runtime.shutdown import GracefulShutdown
from kvmesh.runtime.telemetry import Telemetry
from .commands import BASE_COMMANDS, Command
from .engineproc import EngineProcess
from .heartbeat import HeartbeatInfo, Heartbeater
from .outputhold import OutputHold
from .watchdog import watch_engine
from .settings import WorkerSettings, bound_cpu_kernel_caches, engine_config
from .worker import EngineLoop

log = logging.getLogger(__name__)
S = TypeVar("S", bound=WorkerSettings)


async def serve_worker(
    role: str, settings: S, start: Callable[[S, Bus | None], Awaitable[Any]], ready: asyncio.Event | None = None
) -> None:
    """Runs one worker until SIGTERM/SIGINT: deregister, drain in-flight work for `drain_grace_s`,
    close the app and NATS, flush telemetry. `start(settings, bus)` returns the app, which has
    `deregister()`, `close()` and `worker.drain(grace_s)`."""
    fix_mmap_threshold(settings.malloc_mmap_threshold_kib * 1024)  # NOTE: before the engine's buffers
    telemetry = Telemetry(role, settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    bus = await Bus.connect(settings.nats_url, f"{role}-{settings.worker_id or 'worker'}") if settings.nats_url else None
    app = await start(settings, bus)
    watchdog = asyncio.create_task(
        watch_engine(app.loop, settings.engine_stall_s, app.deregister, min(1.0, settings.engine_stall_s / 4)),
        name=f"{role}-watchdog",
    )
    trimmer = asyncio.create_task(trim_heap(settings.heap_trim_s), name=f"{role}-heap-trim")

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
    watchdog.cancel()
    trimmer.cancel()
    log.info("%s worker shutting down", role)
    await shutdown.run()


def worker_main(
    role: str, settings_cls: type[S], argv: Sequence[str] | None, serve: Callable[[S], Awaitable[None]]
) -> int:
    settings = settings_from_argv(settings_cls, argv, f"kvmesh {role}")
    init_process(settings)
    run_service(serve(settings))
    return 0


@dataclass(slots=True)
class WorkerApp:
    """A running worker: `port`/`endpoint` as bound; `stop()` shuts it down. `worker` is the
    role's servicer core (it has `draining` and `drain(grace_s)`); `extra_close` runs after the
    server stops (e.g. the decode worker's KV hand-back queue)."""

    settings: WorkerSettings
    loop: EngineLoop | EngineProcess
    worker: Any
    server: GrpcServer
    heartbeater: Heartbeater
    channels: ChannelPool
    gauges: asyncio.Task
    endpoint: str
    events: CacheEvents
    metrics_port: int | None = None
    extra_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.server.port

    async def deregister(self) -> None:
        self.worker.draining = True
        await self.server.set_serving(False)
        await self.heartbeater.deregister()

    async def close(self) -> None:
        self.gauges.cancel()
        await self.server.stop(1.0)
        for close in self.extra_close:
            await close()
        await self.channels.close()
        await self.events.close()
        await self.loop.stop()

    async def stop(self, grace_s: float = 0.0) -> None:
        await self.deregister()
        await self.worker.drain(grace_s)
        await self.close()


@dataclass(slots=True)
class EngineParts:
    """What both workers build first: the engine on its own thread (or in its own process: then
    `engine` is an `EngineInfo`), identity, KV spec, channels."""

    engine: Any
    loop: EngineLoop | EngineProcess
    worker_id: str
    spec: Any  # common_pb2.ModelSpec
    tls: TlsConfig | None
    channels: ChannelPool


async def start_engine(
    role: str, settings: WorkerSettings, commands: dict[str, Command] = BASE_COMMANDS, host_module: str | None = None,
) -> EngineParts:
    """Builds the engine off the event loop and starts its thread; with `host_module` (a role's
    `enginehost`), in a process of its own instead (`engineproc.py`)."""
    if host_module is not None:
        loop = await EngineProcess.spawn(host_module, settings)
        engine = loop.engine
    else:
        from kvmesh.engine.llm import LLMEngine  # noqa: PLC0415 - torch, only in worker processes

        apply_cpus(settings.engine_cpus)  # NOTE: the engine's thread shares the process; all of it moves
        bound_cpu_kernel_caches(settings.cpu_kernel_cache_entries)
        engine = await asyncio.to_thread(LLMEngine, engine_config(settings))
        loop = EngineLoop(engine, name=f"{role}-engine", step_delay_s=settings.step_delay_s,
                          step_slowdown=settings.step_slowdown, call_timeout_s=settings.engine_call_timeout_s,
                          commands=commands, hold=OutputHold.from_settings(settings))
    loop.start()
    spec = kvwire.model_spec(engine.hasher.model_id, engine.model_args, engine.hasher.dtype, engine.block_size)
    tls = TlsConfig.from_settings(settings)
    return EngineParts(engine, loop, settings.resolved_worker_id(role), spec, tls, ChannelPool(tls=tls))


async def announce(
    role: str, settings: WorkerSettings, parts: EngineParts, endpoint: str, bus: Bus | None,
    live_requests: Callable[[], list[str]] | None = None,
) -> tuple[CacheEvents, Heartbeater]:
    """Starts publishing the worker's KV cache events and heartbeats on NATS; `live_requests`
    (decode workers) lists the request ids the worker holds, on every beat."""
    info = HeartbeatInfo(
        parts.worker_id, role, endpoint, settings.pool, settings.served_model_name(), parts.engine.block_size,
        settings.max_num_seqs, time.time(), max_model_len=parts.engine.max_model_len,
    )
    events = CacheEvents(parts.loop)
    if bus is not None and not await events.start(bus, parts.worker_id):
        log.warning("engine exposes no KV cache events; this worker's prefix cache is not announced")
    heartbeater = Heartbeater(bus, info, lambda: parts.loop.stats, settings.heartbeat_interval_s, lambda: events.seq,
                              live_requests, lambda: parts.loop.progress)
    heartbeater.start()
    return events, heartbeater
