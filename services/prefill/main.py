"""`kvmesh prefill`: build the engine, serve PrefillWorker over gRPC, heartbeat on NATS, shut down cleanly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kvmesh.runtime import kvwire
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.grpcutil import start_server
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvshards import ShardDirectory
from kvmesh.runtime.metrics import serve_metrics
from kvmesh.runtime.pb import prefill_pb2_grpc
from kvmesh.runtime.telemetry import TracingServerInterceptor
from kvmesh.worker.kvtensor import codec_pool
from kvmesh.worker.app import WorkerApp, announce, serve_worker, start_engine, worker_main
from kvmesh.worker.storereader import StoreReader
from kvmesh.worker.worker import EngineLoop

from . import metrics
from .config import PrefillSettings
from .server import PrefillServicer
from .worker import PrefillWorker

log = logging.getLogger(__name__)


async def start(settings: PrefillSettings, bus: Bus | None = None) -> WorkerApp:
    """Build the engine (off the event loop), start the gRPC server and the heartbeat."""
    parts = await start_engine("prefill", settings)
    loop, worker_id, spec, tls, channels = parts.loop, parts.worker_id, parts.spec, parts.tls, parts.channels
    codec = codec_pool()  # KV block encode/decode off the event loop, bounded
    shards = ShardDirectory.from_setting(settings.kvstore)
    store = None
    if shards is not None:
        await shards.start(bus)
        store = StoreReader(ShardedStore(shards, channels, spec, settings.kvstore_timeout_s,
                                         replicas=settings.kvstore_replicas, hot_hits=settings.kvstore_hot_hits), spec, codec)
    worker = PrefillWorker(
        loop, spec, channels, store, settings.push_timeout_s, kvwire.encoding_from_name(settings.kv_encoding), codec
    )
    server = await start_server(
        settings.host,
        settings.port,
        [(prefill_pb2_grpc.add_PrefillWorkerServicer_to_server, PrefillServicer(worker), "kvmesh.v1.PrefillWorker")],
        [TracingServerInterceptor()],
        tls=tls,
    )
    endpoint = settings.endpoint(server.port)
    events, heartbeater = await announce("prefill", settings, parts, endpoint, bus)
    gauges = asyncio.create_task(_refresh_gauges(loop, settings.heartbeat_interval_s), name="prefill-gauges")
    metrics_port = serve_metrics(settings.host, settings.metrics_port) if settings.metrics_port >= 0 else None
    log.info("prefill worker %s serving on %s (model %s)", worker_id, endpoint, settings.model)
    return WorkerApp(settings, loop, worker, server, heartbeater, channels, gauges, endpoint, events, metrics_port)


async def _refresh_gauges(loop: EngineLoop, interval_s: float) -> None:
    while True:
        s = loop.stats
        metrics.KV_BLOCKS_FREE.set(s.num_free_blocks)
        metrics.KV_BLOCKS_USED.set(s.num_total_blocks - s.num_free_blocks)
        await asyncio.sleep(interval_s)


async def serve(settings: PrefillSettings, ready: asyncio.Event | None = None) -> None:
    await serve_worker("prefill", settings, start, ready)


def main(argv: Sequence[str] | None = None) -> int:
    return worker_main("prefill", PrefillSettings, argv, serve)
