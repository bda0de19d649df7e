"""The running canary: NATS intake → buffer → replay loop, plus the gRPC and REST servers, the
promote / rollback calls to the scheduler and the automatic rollout that makes them itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import uvicorn
from nats.aio.msg import Msg

from kvmesh.runtime.bus import MIRROR_SUBJECT, Bus
from kvmesh.runtime.errors import FailedPrecondition, InvalidArgument, Unavailable
from kvmesh.runtime.grpcutil import DEFAULT_DEADLINE_S, ChannelPool, GrpcServer, TlsConfig, start_server
from kvmesh.runtime.pb import canary_pb2_grpc, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from kvmesh.runtime.telemetry import TracingServerInterceptor, inject_metadata

from .buffer import Admission, MirrorBuffer
from .config import CanarySettings
from .metrics import canary_registry
from .replay import Replayer, ReplayLoop
from .rest import build_app
from .rolloutdriver import OnRestart, RolloutDriver
from .rolloutstore import RolloutStore
from .server import CanaryServicer
from .state import CanaryState, Pools, Report, check_weight

log = logging.getLogger(__name__)


class _HttpServer(uvicorn.Server):
    # NOTE: signals belong to the service's GracefulShutdown, not to uvicorn.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class CanaryService:
    """Build with settings, `await start()`, then `deregister()` / `drain(grace)` / `close()`."""

    def __init__(self, settings: CanarySettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        buffer: MirrorBuffer[events_pb2.MirrorRecord] = MirrorBuffer(
            settings.buffer_bytes, settings.buffer_max_records, settings.dedup_window
        )
        pools = Pools(production=settings.production_pool, candidate=settings.candidate_pool)
        self.state = CanaryState(pools, settings.thresholds(), buffer, settings.latency_window, settings.warmup_replays)
        self.tls = TlsConfig.from_settings(settings)
        self.channels = ChannelPool(tls=self.tls)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channels.get(settings.scheduler))
        replayer = Replayer(self.scheduler, self.channels, settings.replay_timeout_s)
        self.replays = ReplayLoop(self.state, replayer, settings.max_concurrency, settings.noise_sample, rng)
        self.rollout = RolloutDriver(
            self.state, RolloutStore(settings.state_file), self._switch, settings.thresholds(),
            latency_comparable=settings.candidate_cpu_priority == "normal",
            on_restart=OnRestart(settings.rollout_on_restart), tick_s=settings.rollout_tick_s,
        )
        self.registry = canary_registry(self.report, self.rollout)
        self.bus: Bus | None = None
        self.grpc: GrpcServer | None = None
        self.http_port = 0
        self._http: _HttpServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._switch_lock = asyncio.Lock()

    @property
    def port(self) -> int:
        return self.grpc.port if self.grpc else 0

    async def start(self) -> None:
        s = self.settings
        self.bus = await Bus.connect(s.nats_url, "kvmesh-canary")
        await self.bus.subscribe(MIRROR_SUBJECT, events_pb2.MirrorRecord, self._on_record)
        self.replays.start()
        self.rollout.recover()
        self.rollout.begin()
        servicer = CanaryServicer(self.report, self.promote, self.rollback, self.rollout, s.admin_key, s.min_samples)
        self.grpc = await start_server(
            s.host,
            s.port,
            [(canary_pb2_grpc.add_CanaryServicer_to_server, servicer, "kvmesh.v1.Canary")],
            [TracingServerInterceptor()],
            tls=self.tls,
        )
        await self._start_http()
        log.info(
            "canary serving gRPC on %s:%d, REST on %s:%d; candidate pool %r vs production %r",
            s.host, self.grpc.port, s.host, self.http_port, self.state.pools.candidate, self.state.pools.production,
        )

    async def _start_http(self) -> None:
        app = build_app(self.report, self.promote, self.rollback, self.registry, self.health, self.settings.admin_key,
                        self.rollout, self.settings.min_samples)
        sock = _listen(self.settings.host, self.settings.http_port)
        self.http_port = sock.getsockname()[1]
        self._http = _HttpServer(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]), name="canary-http")
        while not self._http.started:
            if self._http_task.done():
                self._http_task.result()
                raise OSError(f"REST server on {self.settings.host}:{self.http_port} stopped during startup")
            await asyncio.sleep(0.01)

    async def _on_record(self, record: events_pb2.MirrorRecord, _msg: Msg) -> None:
        admission = self.state.offer(record)
        if admission is Admission.ACCEPTED:
            self.replays.notify()
        elif admission is None:
            log.debug("mirror record %r not compared (malformed, or served by the candidate)", record.request_id)

    def report(self) -> Report:
        return self.state.report(undecodable=self.bus.malformed if self.bus else 0)

    def health(self) -> dict[str, Any]:
        connected = bool(self.bus and self.bus.connected)
        return {
            "status": "ok",
            "nats_connected": connected,
            "buffered": len(self.state.buffer),
            "replaying": self.replays.inflight,
        }

    def _refuse_during_rollout(self) -> None:
        if self.rollout.running:
            raise FailedPrecondition("a rollout is running and moves the pools itself; DELETE /rollout aborts it")

    async def _switch(self, weight: float) -> Pools:
        """The rollout's own switch: 0 rolls back, anything else promotes that share."""
        return await (self._promote(weight) if weight > 0 else self._rollback())

    async def promote(self, weight: float = 1.0) -> Pools:
        """weight 1: production traffic moves to the candidate pool and the comparison starts over.
        Below 1: the candidate takes that share of production traffic (by session) meanwhile."""
        try:
            check_weight(weight)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        self._refuse_during_rollout()
        return await self._promote(weight)

    async def _promote(self, weight: float) -> Pools:
        async with self._switch_lock:
            pools = self.state.pools
            if weight >= 1.0:
                await self._set_production_pool(scheduler_pb2.SetProductionPoolRequest(pool=pools.candidate))
            else:
                await self._set_production_pool(scheduler_pb2.SetProductionPoolRequest(
                    pool=pools.production, canary_pool=pools.candidate, canary_weight=weight
                ))
            pools = self.state.promote(weight)
        log.info("promoted %.0f%%: production pool %r, candidate pool %r", 100 * weight, pools.production, pools.candidate)
        return pools

    async def rollback(self) -> Pools:
        """Production traffic goes back to the configured production pool, all of it."""
        self._refuse_during_rollout()
        return await self._rollback()

    async def _rollback(self) -> Pools:
        async with self._switch_lock:
            request = scheduler_pb2.SetProductionPoolRequest(pool=self.state.configured.production)
            await self._set_production_pool(request)
            pools = self.state.rollback()
        log.info("rolled back: production pool is %r", pools.production)
        return pools

    async def _set_production_pool(self, request: scheduler_pb2.SetProductionPoolRequest) -> None:
        try:
            await self.scheduler.SetProductionPool(request, timeout=DEFAULT_DEADLINE_S, metadata=inject_metadata())
        except grpc.aio.AioRpcError as exc:
            split = f"{request.pool!r}, {request.canary_pool!r} at {request.canary_weight:g}" if request.canary_pool else repr(request.pool)
            message = f"scheduler {self.settings.scheduler} refused SetProductionPool({split}): {exc.code().name}: {exc.details()}"
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(message) from exc
            raise FailedPrecondition(message) from exc

    async def deregister(self) -> None:
        if self.grpc:
            await self.grpc.set_serving(False)

    async def drain(self, grace_s: float) -> None:
        await self.replays.stop(grace_s)

    async def close(self) -> None:
        await self.rollout.stop()
        await self.replays.stop(0)
        if self._http and self._http_task:
            self._http.should_exit = True
            await asyncio.gather(self._http_task, return_exceptions=True)
        if self.grpc:
            await self.grpc.stop(1.0)
        if self.bus:
            await self.bus.close()
        await self.channels.close()
