"""Handing finished turns to the KV store: best effort, in the background, bounded.

The KV of a whole turn (prompt + completion, full blocks only) goes out with a two-phase
`KvStore.Put` (open, blocks, commit). A full queue drops the turn; a failed put is logged.
Neither ever delays or fails a response.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import torch

from kvmesh.runtime import kvwire
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc
from kvmesh.runtime.telemetry import inject_metadata, tracer

from . import metrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Turn:
    hashes: list[bytes]
    blocks: list[torch.Tensor]  # each [2, L, block_size, H, D]


class Handback:
    """`offer(turn)` from anywhere on the event loop; one task puts turns to the store."""

    def __init__(
        self, endpoint: str, channels: ChannelPool, spec: common_pb2.ModelSpec, producer_id: str,
        max_queue: int = 16, timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.spec = spec
        self.producer_id = producer_id
        self.timeout_s = timeout_s
        self.dropped = 0
        self.blocks_stored = 0
        self._channels = channels
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
                log.warning("KV handback to %s failed: %s", self.endpoint, exc)

    async def _put(self, turn: Turn) -> None:
        messages = await asyncio.to_thread(self._encode, turn)
        stub = kvstore_pb2_grpc.KvStoreStub(self._channels.get(self.endpoint))
        with tracer.start_as_current_span("kvstore.put", attributes={"blocks": len(turn.blocks)}) as span:
            reply = await stub.Put(iter(messages), timeout=self.timeout_s, metadata=inject_metadata())
            span.set_attribute("stored", reply.stored)
            span.set_attribute("duplicates", reply.duplicates)
        self.blocks_stored += len(turn.blocks)
        metrics.HANDBACK_BLOCKS.inc(len(turn.blocks))

    def _encode(self, turn: Turn) -> list[kvstore_pb2.PutMessage]:
        out = [kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(spec=self.spec, producer_id=self.producer_id))]
        for i, (block_hash, kv) in enumerate(zip(turn.hashes, turn.blocks)):
            block = kvwire.encode_block(kv, encoding=kvwire.RAW, block_hash=block_hash, block_index=i)
            out.append(kvstore_pb2.PutMessage(block=block))
        out.append(kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=len(turn.blocks))))
        return out
