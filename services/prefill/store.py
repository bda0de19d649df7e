"""Reading a prompt's cached prefix from the KV store: Lookup, then Get, under a short deadline.

The store may be sharded (`runtime/kvshardclient.py` fans the lookup out per shard). It is an
optimisation: any failure (down, slow, bad frame) means "nothing cached" from that block on.
"""

from __future__ import annotations

import logging

import grpc
import torch

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.worker.offload import CodecPool
from kvmesh.runtime.errors import MeshError
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.pb import common_pb2
from kvmesh.runtime.telemetry import tracer

log = logging.getLogger(__name__)


class StoreReader:
    def __init__(self, store: ShardedStore, spec: common_pb2.ModelSpec, codec: CodecPool | None = None) -> None:
        self.store = store
        self.codec = codec or CodecPool()
        self.spec = spec
        self._failures = 0

    @property
    def failures(self) -> int:
        """Fetches that fell back to computing (a shard or the whole store failed)."""
        return self._failures + self.store.failures

    async def fetch(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        """Blocks `skip..k` of the prompt, where the store holds its first `k` blocks; [] on any failure."""
        if skip >= len(hashes):
            return []
        try:
            return await self._fetch(hashes, skip)
        except (grpc.aio.AioRpcError, MeshError, ValueError) as exc:
            self._failures += 1
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("KV store unavailable for this prefill (%s); computing instead", detail)
            return []

    async def _fetch(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        with tracer.start_as_current_span("kvstore.lookup", attributes={"query_blocks": len(hashes)}) as span:
            found = await self.store.lookup(hashes)
            span.set_attribute("hit_blocks", found.num_blocks)
        end = min(found.num_blocks, len(hashes))
        if end <= skip:
            return []
        blocks: list[torch.Tensor] = []
        with tracer.start_as_current_span("kvstore.get", attributes={"blocks": end - skip}):
            for i, block in enumerate(await self.store.get(hashes, skip, found, kvwire.RAW)):
                if block.header.num_tokens != self.spec.block_size:
                    raise ValueError(f"store sent a partial block at position {skip + i}")
                blocks.append(await self.codec.run(kvtensor.decode_block, block, self.spec))  # off the event loop
        return blocks
