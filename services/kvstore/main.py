"""`kvmesh kvstore`: build the store from settings, serve gRPC + metrics, heartbeat, shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvmesh.runtime.bus import HEARTBEAT_SUBJECT, Bus
from kvmesh.runtime.config import settings_from_argv
from kvmesh.runtime.grpcutil import GrpcServer, TlsConfig, advertised_endpoint, start_server
from kvmesh.runtime.heap import fix_mmap_threshold, trim_heap
from kvmesh.runtime.heartbeats import beat_on_request
from kvmesh.runtime.kvevents import KvEventPublisher
from kvmesh.runtime.metrics import serve_metrics
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2, events_pb2, kvstore_pb2_grpc
from kvmesh.runtime.process import init_process, run_service
from kvmesh.runtime.shutdown import GracefulShutdown
from kvmesh.runtime.telemetry import Telemetry, TracingServerInterceptor

from .config import KvStoreSettings
from .disk import DiskDir
from .metrics import StoreMetrics
from .server import EventFeed, KvStoreServicer
from .store import BlockStore

log = logging.getLogger("kvmesh.kvstore")


@dataclass(slots=True)
class RunningStore:
    """A started store: gRPC server, core, NATS feeds and background tasks."""

    settings: KvStoreSettings
    store_id: str
    server: GrpcServer
    servicer: KvStoreServicer
    bus: Bus | None
    publisher: KvEventPublisher | None
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def store(self) -> BlockStore:
        return self.servicer.store

    @property
    def endpoint(self) -> str:
        return advertised_endpoint(self.settings.host, self.settings.advertise_host, self.server.port)

    def heartbeat(self) -> events_pb2.Heartbeat:
        return events_pb2.Heartbeat(
            worker_id=self.store_id, role=common_pb2.WORKER_ROLE_KVSTORE, endpoint=self.endpoint,
            model=self.settings.served_model_name(), block_size=self.settings.block_size,
            num_running=self.store.open_puts, timestamp=time.time(), started_at=self.started_at,
            draining=self.draining, kv_event_seq=self.servicer.feed.seq,
        )

    async def deregister(self) -> None:
        self.draining = True
        await self.server.set_serving(False)
        await self._send_heartbeat()

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stops serving, then moves memory blocks to disk (when there is a disk tier)."""
        await self.server.stop(grace_s)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.servicer.thread.run(self.store.persist)
        await self.servicer.after_change()
        self.servicer.thread.close()
        if self.publisher is not None:
            await self.publisher.close()
        if self.bus is not None:
            await self.bus.close()

    async def _send_heartbeat(self) -> None:
        if self.bus is None:
            return
        subject = HEARTBEAT_SUBJECT.format(role="kvstore", worker_id=self.store_id)
        try:
            await self.bus.publish(subject, self.heartbeat())
        except Exception as exc:  # noqa: BLE001 - NATS away: the next beat tries again
            log.debug("heartbeat not sent: %s", exc)

    async def _heartbeats(self) -> None:
        while True:
            await self._send_heartbeat()
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            await self.servicer.tick()


async def start(settings: KvStoreSettings, metrics: StoreMetrics | None = None) -> RunningStore:
    """Builds the core (rebuilding a disk tier's index), starts gRPC, NATS feeds and timers."""
    store_id = settings.store_id or f"kvstore-{socket.gethostname()}-{os.getpid()}"
    disk = DiskDir(settings.disk_dir) if settings.disk_bytes > 0 else None
    store = BlockStore(settings.store_config(), time.monotonic, disk)
    if disk is not None:
        log.info("disk tier %s: %d blocks rebuilt", settings.disk_dir, len(store.held_hashes()))
    thread = Offload("kvstore-io")
    bus = publisher = None
    if settings.nats:
        try:
            bus = await Bus.connect(settings.nats_url, store_id)
            publisher = await KvEventPublisher.start(bus, store_id, functools.partial(thread.locked, store.held_hashes))
        except Exception as exc:  # noqa: BLE001 - the store still serves gRPC without NATS
            log.warning("NATS unavailable (%s): no heartbeats or KV events", exc)
            bus = publisher = None
    servicer = KvStoreServicer(store, metrics or StoreMetrics(), EventFeed(publisher), thread)
    server = await start_server(
        settings.host, settings.port, [(kvstore_pb2_grpc.add_KvStoreServicer_to_server, servicer, "kvmesh.v1.KvStore")],
        interceptors=[TracingServerInterceptor()], tls=TlsConfig.from_settings(settings),
    )
    running = RunningStore(settings, store_id, server, servicer, bus, publisher)
    await servicer.after_change()  # AllCleared (+ what the disk tier holds) as the first batch
    running.tasks = [asyncio.create_task(running._ticks(), name="kvstore-tick"),
                     asyncio.create_task(trim_heap(settings.heap_trim_s), name="kvstore-heap-trim")]
    if bus is not None:
        bus.on_reconnect(running._send_heartbeat)
        await beat_on_request(bus, running._send_heartbeat)  # a scheduler replica that starts asks
        running.tasks.append(asyncio.create_task(running._heartbeats(), name="kvstore-heartbeat"))
    return running


async def serve(settings: KvStoreSettings, ready: asyncio.Event | None = None) -> None:
    fix_mmap_threshold(settings.malloc_mmap_threshold_kib * 1024)
    telemetry = Telemetry("kvstore", settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    if settings.metrics_port >= 0:
        serve_metrics(settings.host, settings.metrics_port)
    running = await start(settings)
    shutdown = GracefulShutdown(grace_s=settings.drain_grace_s)
    shutdown.install()
    shutdown.deregister.append(running.deregister)
    shutdown.drain.append(running.stop)
    if telemetry is not None:
        shutdown.close.append(lambda: asyncio.to_thread(telemetry.shutdown))
    log.info("kvstore %s serving on %s", running.store_id, running.endpoint)
    if ready is not None:
        ready.set()
    await shutdown.wait()
    await shutdown.run()


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_argv(KvStoreSettings, argv, "kvmesh kvstore")
    init_process(settings)
    run_service(serve(settings))
    return 0
