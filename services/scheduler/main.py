"""kvmesh scheduler entry point: settings → router + admission → gRPC server + NATS feeds."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.config import settings_from_argv
from kvmesh.runtime.grpcutil import GrpcServer, TlsConfig, advertised_endpoint, start_server
from kvmesh.runtime.metrics import serve_metrics
from kvmesh.runtime.pb import scheduler_pb2_grpc
from kvmesh.runtime.process import init_process, run_service
from kvmesh.runtime.shutdown import GracefulShutdown
from kvmesh.runtime.telemetry import Telemetry, TracingServerInterceptor

from . import metrics
from .admission import AdmissionQueue
from .config import SchedulerSettings
from .feeds import BusFeeds, sweep_interval
from .index import BlockIndex
from .peers import Peers
from .policy import make_policy
from .prewarm import Prewarmer
from .prewarmfeed import PrewarmSender
from .registry import Registry
from .replicas import ReplicaSet
from .router import Router
from .server import AdmissionGate, SchedulerServicer, refresh, workers_reply
from .sticky import StickySessions
from .sync import StartupSync, SyncResult

log = logging.getLogger("kvmesh.scheduler")


def build_router(settings: SchedulerSettings) -> Router:
    settings.check()
    registry = Registry(heartbeat_timeout_s=settings.heartbeat_timeout_s, clock=time.monotonic,
                        reconcile_grace_s=settings.reconcile_grace_s,
                        stall_s=settings.engine_stall_s)
    policy = make_policy(settings.policy, settings.policy_config())
    return Router(registry, BlockIndex(), policy, StickySessions(settings.sticky_ttl_s), settings.router_config(),
                  Prewarmer(settings.prewarm_config()))


@dataclass(slots=True)
class SchedulerApp:
    """A running scheduler: `await SchedulerApp.start(settings)`, then `await app.stop()`."""

    router: Router
    gate: AdmissionGate
    server: GrpcServer
    bus: Bus
    feeds: BusFeeds
    prewarm: PrewarmSender
    peers: Peers
    synced: SyncResult

    @property
    def port(self) -> int:
        return self.server.port

    @classmethod
    async def start(cls, settings: SchedulerSettings) -> SchedulerApp:
        router = build_router(settings)
        gate = AdmissionGate(AdmissionQueue(settings.admission_config(), time.monotonic))
        counters = metrics.IndexCounters()
        replica_id = settings.replica_id or f"scheduler-{socket.gethostname()}-{os.getpid()}"
        replicas = ReplicaSet(replica_id, settings.replica_timeout_s, time.monotonic)
        bus = await Bus.connect(settings.nats_url, replica_id)
        prewarm = PrewarmSender(router, bus, settings.prewarm_timeout_s)

        def on_change() -> None:
            refresh(router, gate, counters, replicas)
            prewarm.kick()

        feeds = BusFeeds(router, bus, on_change, settings.replay_timeout_s)
        await feeds.start(sweep_interval(settings.heartbeat_timeout_s))
        servicer = SchedulerServicer(router, gate)
        sync = StartupSync(router, bus, replicas, settings.sync_timeout_s, settings.sync_alone_s)
        servicer.until_synced = sync.until_synced
        server = await start_server(
            settings.host,
            settings.port,
            [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, "kvmesh.v1.Scheduler")],
            interceptors=[TracingServerInterceptor()],
            tls=TlsConfig.from_settings(settings),
            serving=False,  # NOT_SERVING until synced
        )
        endpoint = advertised_endpoint(settings.host, "", server.port)
        peers = Peers(router, bus, replicas, endpoint, on_change, settings.replica_heartbeat_s)
        servicer.on_routed = peers.routed
        servicer.on_split = peers.split_changed
        servicer.on_completed = peers.completed
        await peers.start()
        synced = await sync.run()
        await peers.answer_sync(lambda: workers_reply(router))
        on_change()
        await server.set_serving(True)
        peers.start_heartbeats()
        log.info("scheduler %s serving on %s:%d (policy %s); synced in %.2f s (%s, %d workers known%s)", replica_id,
                 settings.host, server.port, settings.policy, synced.waited_s,
                 "from a peer" if synced.peer else "no peer", len(router.registry.all()),
                 f"; timed out waiting for {', '.join(synced.still_missing) or 'a peer heartbeat'}" if synced.timed_out else "")
        return cls(router, gate, server, bus, feeds, prewarm, peers, synced)

    async def stop(self, grace_s: float = 1.0) -> None:
        await self.server.set_serving(False)
        await self.server.stop(grace_s)
        await self.feeds.stop()
        await self.prewarm.stop()
        await self.peers.stop()
        await self.bus.close()


async def serve(settings: SchedulerSettings, ready: asyncio.Event | None = None) -> None:
    telemetry = Telemetry("scheduler", settings.otlp_endpoint, settings.trace_dir) if settings.tracing else None
    if settings.metrics_port >= 0:
        metrics_port = serve_metrics(settings.host, settings.metrics_port)
        log.info("metrics on %s:%d/metrics", settings.host, metrics_port)
    app = await SchedulerApp.start(settings)
    shutdown = GracefulShutdown(grace_s=2.0)
    shutdown.install()
    shutdown.deregister.append(lambda: app.server.set_serving(False))
    shutdown.close.append(app.stop)
    if telemetry is not None:
        shutdown.close.append(lambda: asyncio.to_thread(telemetry.shutdown))
    if ready is not None:
        ready.set()
    await shutdown.wait()
    await shutdown.run()


def main(argv: list[str] | None = None) -> int:
    settings = settings_from_argv(SchedulerSettings, argv, "kvmesh scheduler")
    init_process(settings)
    try:
        settings.check()
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    run_service(serve(settings))
    return 0
