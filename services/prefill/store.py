"""Reading a prompt's cached prefix from the KV store: Lookup, then Get, under a short deadline.

The store is an optimisation: any failure (down, slow, bad frame) means "nothing cached".
"""

from __future__ import annotations

import logging

import grpc
import torch

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.worker.offload import CodecPool
from kvmesh.runtime.errors import MeshError
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc
from kvmesh.runtime.telemetry import inject_metadata, tracer

log = logging.getLogger(__name__)


class StoreReader:
    def __init__(
        self, endpoint: str, channels: ChannelPool, spec: common_pb2.ModelSpec, timeout_s: float,
        codec: CodecPool | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.codec = codec or CodecPool()
        self.spec = spec
        self.timeout_s = timeout_s
        self.failures = 0
        self._channels = channels

    async def fetch(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        """Blocks `skip..k` of the prompt, where the store holds its first `k` blocks; [] on any failure."""
        if skip >= len(hashes):
            return []
        try:
            return await self._fetch(hashes, skip)
        except (grpc.aio.AioRpcError, MeshError, ValueError) as exc:
            self.failures += 1
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("KV store %s unavailable for this prefill (%s); computing instead", self.endpoint, detail)
            return []

    async def _fetch(self, hashes: list[bytes], skip: int) -> list[torch.Tensor]:
        stub = kvstore_pb2_grpc.KvStoreStub(self._channels.get(self.endpoint))
        with tracer.start_as_current_span("kvstore.lookup", attributes={"query_blocks": len(hashes)}) as span:
            found = await stub.Lookup(
                kvstore_pb2.LookupRequest(spec=self.spec, block_hashes=hashes),
                timeout=self.timeout_s,
                metadata=inject_metadata(),
            )
            span.set_attribute("hit_blocks", found.num_blocks)
        end = min(found.num_blocks, len(hashes))
        if end <= skip:
            return []
        wanted = hashes[skip:end]
        blocks: list[torch.Tensor] = []
        with tracer.start_as_current_span("kvstore.get", attributes={"blocks": len(wanted)}):
            call = stub.Get(
                kvstore_pb2.GetRequest(spec=self.spec, block_hashes=wanted, lease_id=found.lease_id, encoding=kvwire.RAW),
                timeout=self.timeout_s * 4,
                metadata=inject_metadata(),
            )
            async for block in call:
                i = len(blocks)
                if i >= len(wanted) or block.header.block_hash != wanted[i]:
                    raise ValueError(f"store sent an unexpected block at position {skip + i}")
                if block.header.num_tokens != self.spec.block_size:
                    raise ValueError(f"store sent a partial block at position {skip + i}")
                blocks.append(await self.codec.run(kvtensor.decode_block, block, self.spec))  # off the event loop
        return blocks
