"""`kvmesh decode`: build the engine, serve DecodeWorker over gRPC, heartbeat on NATS, shut down cleanly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kvmesh.engine.outputs import EngineStats
from kvmesh.runtime import kvwire
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.grpcutil import start_server
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvshards import ShardDirectory
from kvmesh.runtime.metrics import serve_metrics
from kvmesh.runtime.pb import decode_pb2_grpc
from kvmesh.runtime.telemetry import TracingServerInterceptor
from kvmesh.worker.app import WorkerApp, announce, serve_worker, start_engine, worker_main
from kvmesh.worker.storereader import StoreReader
from kvmesh.worker.engineproc import EngineProcess
from kvmesh.worker.worker import EngineLoop

from . import metrics
from .commands import COMMANDS
from .config import DecodeSettings
from .handback import Handback
from .prewarm import PREWARM_TIMEOUT_S, Prewarm
from .server import DecodeServicer
from .worker import DecodeWorker

log = logging.getLogger(__name__)


async def start(settings: DecodeSettings, bus: Bus | None = None) -> WorkerApp:
    """Build the engine (off the event loop), start the gRPC server and the heartbeat."""
    host = "kvmesh.decode.enginehost" if settings.engine_process else None
    parts = await start_engine("decode", settings, COMMANDS, host)
    loop, worker_id, spec, tls, channels = parts.loop, parts.worker_id, parts.spec, parts.tls, parts.channels
    handback = None
    shards = ShardDirectory.from_setting(settings.kvstore)
    if shards is not None:
        await shards.start(bus)
        store = ShardedStore(shards, channels, spec, settings.kvstore_timeout_s, settings.kvstore_put_timeout_s)
        handback = Handback(store, spec, worker_id, loop, parts.engine.hasher, settings.handback_queue,
                            settings.handback_window_s, settings.handback_batch_turns, settings.handback_max_window_s)
        handback.start()
    worker = DecodeWorker(
        loop, spec, worker_id, "", channels, settings.prefill_timeout_s, handback,
        kvwire.encoding_from_name(settings.kv_encoding),
    )
    server = await start_server(
        settings.host,
        settings.port,
        [(decode_pb2_grpc.add_DecodeWorkerServicer_to_server, DecodeServicer(worker), "kvmesh.v1.DecodeWorker")],
        [TracingServerInterceptor()],
        tls=tls,
    )
    worker.endpoint = settings.endpoint(server.port)
    reader = None if shards is None else StoreReader(ShardedStore(shards, channels, spec, PREWARM_TIMEOUT_S), spec, worker.codec)
    prewarm = Prewarm(loop, reader)
    await prewarm.start(bus, worker_id)  # NOTE: before the first heartbeat, which may trigger it
    events, heartbeater = await announce("decode", settings, parts, worker.endpoint, bus, worker.live_request_ids)
    gauges = asyncio.create_task(_refresh_gauges(loop, settings.heartbeat_interval_s), name="decode-gauges")
    metrics_port = serve_metrics(settings.host, settings.metrics_port) if settings.metrics_port >= 0 else None
    log.info("decode worker %s serving on %s (model %s)", worker_id, worker.endpoint, settings.model)
    extra_close = [prewarm.close, *([handback.close] if handback is not None else [])]
    return WorkerApp(settings, loop, worker, server, heartbeater, channels, gauges, worker.endpoint, events,
                     metrics_port, extra_close)


async def _refresh_gauges(loop: EngineLoop | EngineProcess, interval_s: float) -> None:
    seen_query = seen_hit = seen_steps = 0
    seen_batches: dict[str, int] = {}
    while True:
        s = loop.stats
        steps = loop.num_steps
        metrics.ENGINE_STEPS.inc(max(0, steps - seen_steps))
        seen_steps = steps
        seen_batches = _count_batches(s, seen_batches)
        metrics.RUNNING.set(s.num_running)
        metrics.WAITING.set(s.num_waiting)
        metrics.KV_BLOCKS_FREE.set(s.num_free_blocks)
        metrics.KV_BLOCKS_USED.set(s.num_total_blocks - s.num_free_blocks)
        metrics.PREFIX_QUERY_TOKENS.inc(max(0, s.prefix_query_tokens - seen_query))
        metrics.PREFIX_HIT_TOKENS.inc(max(0, s.prefix_hit_tokens - seen_hit))
        seen_query, seen_hit = s.prefix_query_tokens, s.prefix_hit_tokens
        await asyncio.sleep(interval_s)


_BATCH_COUNTERS = (("steps", metrics.MODEL_STEPS, 1), ("step_rows", metrics.STEP_DECODE_ROWS, 1),
                   ("step_padded_kv_tokens", metrics.STEP_PADDED_KV_TOKENS, 1), ("step_micros", metrics.ENGINE_BUSY, 1e-6),
                   ("step_cpu_micros", metrics.ENGINE_STEP_CPU, 1e-6))


def _count_batches(s: EngineStats, seen: dict[str, int]) -> dict[str, int]:
    """Adds the engine's step counters (EngineStats' decode_* and prefill_*) since `seen` to /metrics."""
    now = {}
    for kind in ("decode", "prefill"):
        for what, counter, scale in _BATCH_COUNTERS:
            name = f"{kind}_{what}"
            now[name] = getattr(s, name)
            counter.labels(kind).inc(max(0, now[name] - seen.get(name, 0)) * scale)
    now["between"] = s.between_steps_micros
    metrics.ENGINE_BETWEEN.inc(max(0, now["between"] - seen.get("between", 0)) / 1e6)
    return now


async def serve(settings: DecodeSettings, ready: asyncio.Event | None = None) -> None:
    await serve_worker("decode", settings, start, ready)


def main(argv: Sequence[str] | None = None) -> int:
    return worker_main("decode", DecodeSettings, argv, serve)
