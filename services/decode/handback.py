"""Handing finished turns to the KV store: best effort, in the background, bounded.

Only the blocks the store lacks leave: the turn's block hashes are looked up first (`Lookup`
answers the leading run it holds) and the rest are pinned in the engine (one short command
between steps), copied and encoded on a worker thread - never on the engine thread - and put
with a two-phase `KvStore.Put` per owner shard (`runtime/kvshardclient.py`; one store is one shard). A full queue drops the turn before anything is hashed or copied;
a failed put is logged. Neither ever delays or fails a response.
"""

from __future__ import annotations

import asyncio
import logging

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.pb import common_pb2
from kvmesh.runtime.telemetry import tracer
from kvmesh.worker.worker import EngineLoop

from . import metrics

log = logging.getLogger(__name__)


class Handback:
    """`offer(tokens)` from the event loop when a turn ends; one task puts turns to the store."""

    def __init__(
        self, store: ShardedStore, spec: common_pb2.ModelSpec, producer_id: str, loop: EngineLoop, hasher: BlockHasher,
        max_queue: int = 16,
    ) -> None:
        self.store = store
        self.spec = spec
        self.producer_id = producer_id
        self.dropped = 0
        self.blocks_stored = 0
        self.blocks_skipped = 0  # already in the store
        self._loop = loop
        self._hasher = hasher
        self._queue: asyncio.Queue[list[int]] = asyncio.Queue(maxsize=max_queue)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kv-handback")

    def offer(self, tokens: list[int]) -> bool:
        """Queue a finished turn (prompt + output token ids); False when dropped or too short."""
        if len(tokens) < self.spec.block_size:
            return False
        try:
            self._queue.put_nowait(tokens)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            tokens = await self._queue.get()
            try:
                await self._put(tokens)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("KV handback failed: %s", exc)

    async def _put(self, tokens: list[int]) -> None:
        hashes = self._hasher.hashes(tokens)
        lookup = await self.store.lookup(hashes)
        held = min(lookup.num_blocks, len(hashes))
        self.blocks_skipped += held
        if held == len(hashes):
            return
        pinned = await self._loop.call(lambda engine: engine.pin_cached_blocks(tokens, held))
        try:
            blocks = await asyncio.to_thread(self._encode, pinned, hashes, held)
        finally:
            self._loop.call_nowait(lambda engine: engine.unpin_blocks(pinned))
        if not pinned:
            return
        with tracer.start_as_current_span("kvstore.put", attributes={"blocks": len(pinned)}) as span:
            stored, duplicates = await self.store.put(self.producer_id, blocks)
            span.set_attribute("stored", stored)
            span.set_attribute("duplicates", duplicates)
        self.blocks_stored += len(pinned)
        metrics.HANDBACK_BLOCKS.inc(len(pinned))

    def _encode(self, pinned: list[int], hashes: list[bytes], start: int) -> list[common_pb2.KvBlock]:
        blocks = self._loop.engine.read_blocks(pinned)  # [2, L, block_size, H, D] each
        return [kvtensor.encode_block(kv, encoding=kvwire.RAW, block_hash=hashes[start + i], block_index=start + i)
                for i, kv in enumerate(blocks)]
