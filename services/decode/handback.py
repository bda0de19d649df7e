"""Handing finished turns to the KV store: best effort, in the background, bounded.

The KV of a whole turn (prompt + completion, full blocks only) goes out with a two-phase
`KvStore.Put` (open, blocks, commit), one per owner shard (`runtime/kvshardclient.py`). A full queue drops the turn; a failed put is logged.
Neither ever delays or fails a response.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import torch

from kvmesh.runtime import kvwire
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.pb import common_pb2
from kvmesh.runtime.telemetry import tracer

from . import metrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Turn:
    hashes: list[bytes]
    blocks: list[torch.Tensor]  # each [2, L, block_size, H, D]


class Handback:
    """`offer(turn)` from anywhere on the event loop; one task puts turns to the store."""

    def __init__(self, store: ShardedStore, producer_id: str, max_queue: int = 16) -> None:
        self.store = store
        self.producer_id = producer_id
        self.dropped = 0
        self.blocks_stored = 0
        self._queue: asyncio.Queue[Turn] = asyncio.Queue(maxsize=max_queue)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kv-handback")

    def offer(self, turn: Turn) -> bool:
        if not turn.blocks:
            return False
        try:
            self._queue.put_nowait(turn)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            turn = await self._queue.get()
            try:
                await self._put(turn)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("KV handback failed: %s", exc)

    async def _put(self, turn: Turn) -> None:
        blocks = await asyncio.to_thread(self._encode, turn)
        with tracer.start_as_current_span("kvstore.put", attributes={"blocks": len(turn.blocks)}) as span:
            stored, duplicates = await self.store.put(self.producer_id, blocks)
            span.set_attribute("stored", stored)
            span.set_attribute("duplicates", duplicates)
        self.blocks_stored += len(turn.blocks)
        metrics.HANDBACK_BLOCKS.inc(len(turn.blocks))

    def _encode(self, turn: Turn) -> list[common_pb2.KvBlock]:
        return [kvwire.encode_block(kv, encoding=kvwire.RAW, block_hash=block_hash, block_index=i)
                for i, (block_hash, kv) in enumerate(zip(turn.hashes, turn.blocks))]
