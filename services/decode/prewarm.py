"""Pre-warming this decode worker: the scheduler names the mesh's hottest prefixes when the worker
registers (`kvmesh.kv.prewarm.<worker_id>`, PrewarmRequest); the worker fetches their KV blocks
from the KV store into its prefix cache and replies (PrewarmReply) when done.

The worker serves requests meanwhile (the scheduler routes to it as a cold worker). The store's
blocks carry no token ids, so they are cached under their chained hash alone; the first request
whose prompt has that hash confirms them (engine/block_manager.py). Every block cached is a KV
event like any other, so the scheduler's index learns what the worker now holds.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.aio.msg import Msg
from prometheus_client import Counter

from kvmesh.runtime.bus import KV_PREWARM_SUBJECT, Bus
from kvmesh.runtime.pb import events_pb2
from kvmesh.worker.storereader import READ_ERRORS, StoreReader, read_error_detail
from kvmesh.worker.engineproc import EngineProcess
from kvmesh.worker.worker import EngineLoop

log = logging.getLogger(__name__)

PREWARM_TIMEOUT_S = 10.0  # deadline of each store call a pre-warm makes (it runs in the background)

PREWARM_BLOCKS = Counter("kvmesh_decode_prewarm_blocks_total", "KV blocks fetched from the store to pre-warm the prefix cache")


class Prewarm:
    """Answers pre-warm requests for `worker_id` with blocks read by `store` (None: no KV store)."""

    def __init__(self, loop: EngineLoop | EngineProcess, store: StoreReader | None) -> None:
        self._loop = loop
        self._store = store
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, bus: Bus | None, worker_id: str) -> None:
        """Subscribes before the worker's first heartbeat, so the scheduler's request finds it."""
        if bus is not None:
            await bus.subscribe(KV_PREWARM_SUBJECT.format(worker_id=worker_id), events_pb2.PrewarmRequest, self._on_request)

    async def _on_request(self, request: events_pb2.PrewarmRequest, msg: Msg) -> None:
        # NOTE: a task, so a long warm-up does not hold up the subscription's other messages.
        task = asyncio.create_task(self._answer(request, msg), name="decode-prewarm")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request: events_pb2.PrewarmRequest, msg: Msg) -> None:
        reply = await self.warm(request)
        log.info("pre-warmed %d/%d blocks in %.2f s%s", reply.blocks_cached, reply.blocks_requested, reply.seconds,
                 f" ({reply.error})" if reply.error else "")
        if msg.reply:
            await msg.respond(reply.SerializeToString())

    async def warm(self, request: events_pb2.PrewarmRequest) -> events_pb2.PrewarmReply:
        """Fetches each prefix's blocks the store holds (blocks an earlier prefix brought are not
        fetched again) and caches them."""
        start = time.perf_counter()
        requested = {h for p in request.prefixes for h in p.block_hashes}
        reply = events_pb2.PrewarmReply(blocks_requested=len(requested))
        done: set[bytes] = set()
        try:
            if self._store is None:
                raise ValueError("this worker has no KV store to fetch from")
            for prefix in request.prefixes:
                hashes = list(prefix.block_hashes)
                skip = next((i for i, h in enumerate(hashes) if h not in done), len(hashes))
                blocks = await self._store.read(hashes, skip)
                reply.blocks_fetched += len(blocks)
                cached = await self._loop.call("import_by_hash", hashes, blocks, skip)
                done.update(hashes[skip : skip + cached])
                if cached < len(blocks):
                    raise ValueError(f"the prefix cache is full after {len(done)} blocks")
        except READ_ERRORS as exc:
            reply.error = read_error_detail(exc)
        reply.blocks_cached = len(done)
        reply.seconds = time.perf_counter() - start
        PREWARM_BLOCKS.inc(reply.blocks_fetched)
        return reply

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
