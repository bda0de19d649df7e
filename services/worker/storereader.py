"""Reading a prefix's cached KV blocks from the KV store: Lookup, then Get, blocks decoded to
tensors on the codec pool (off the event loop).

Used by the prefill worker (a prompt's cached prefix, under a short deadline) and the decode
worker's pre-warm (the mesh's hottest prefixes). The store may be sharded
(`runtime/kvshardclient.py` fans the lookup out per shard). For a prefill it is an optimisation:
`fetch` turns any failure (down, slow, bad frame) into "nothing cached" from that block on;
`read` raises instead, for a caller that reports the failure (pre-warm's reply).
"""

from __future__ import annotations

import logging

import grpc
import torch

from kvmesh.runtime import kvwire
from kvmesh.runtime.errors import MeshError
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2
from kvmesh.runtime.telemetry import tracer

from . import kvtensor

log = logging.getLogger(__name__)
READ_ERRORS = (grpc.aio.AioRpcError, MeshError, ValueError)  # what `read` raises when the store fails it


def read_error_detail(exc: Exception) -> str:
    """One of READ_ERRORS in words (a gRPC error's details, not its whole repr)."""
    return exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)


class StoreReader:
    """Fetches blocks of `spec` from `store`; see the module docstring."""

    def __init__(self, store: ShardedStore, spec: common_pb2.ModelSpec, codec: Offload | None = None) -> None:
        self.store = store
        self.codec = codec or kvtensor.codec_pool()
        self.spec = spec
        self._failures = 0

    @property
    def failures(self) -> int:
        """Fetches that fell back to computing (a shard or the whole store failed)."""
        return self._failures + self.store.failures

    async def fetch(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        """Blocks `skip..k` of a prefix whose first `k` blocks the store holds; [] on any failure."""
        try:
            return await self.read(hashes, skip)
        except READ_ERRORS as exc:
            self._failures += 1
            log.warning("KV store unavailable for this prefill (%s); computing instead", read_error_detail(exc))
            return []

    async def read(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        """Blocks `skip..k` (each [2, L, block_size, Hkv, D]) as `fetch`, but a failure raises one
        of READ_ERRORS. A shard that fails costs only its blocks (the prefix ends there)."""
        if skip >= len(hashes):
            return []
        with tracer.start_as_current_span("kvstore.lookup", attributes={"query_blocks": len(hashes)}) as span:
            found = await self.store.lookup(hashes)
            span.set_attribute("hit_blocks", found.num_blocks)
        end = min(found.num_blocks, len(hashes))
        if end <= skip:
            return []
        blocks: list[torch.Tensor] = []
        with tracer.start_as_current_span("kvstore.get", attributes={"blocks": end - skip}):
            for i, frame in enumerate(await self.store.get(hashes, skip, found, kvwire.RAW)):
                if frame.header.num_tokens != self.spec.block_size:
                    raise ValueError(f"store sent a partial block at position {skip + i}")
                blocks.append(await self.codec.run(kvtensor.decode_frame, frame, self.spec))  # parsed off the event loop
        return blocks
