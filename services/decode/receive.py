"""Receiving pushed KV: one `PendingKv` per request waiting for its prompt's blocks.

A decode worker registers a pending receive before it asks a prefill worker for the KV; the
PushKv stream fills it block by block, each frame validated (spec, index, token count, chained
hash, checksum) before its bytes are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.runtime.errors import InvalidArgument, NotFound
from kvmesh.runtime.pb import common_pb2, decode_pb2


@dataclass(slots=True)
class PendingKv:
    """The KV of prompt tokens [start_block * block_size, num_tokens) as it arrives."""

    request_id: str
    num_tokens: int  # len(prompt) - 1
    start_block: int
    block_size: int
    hashes: list[bytes]  # chained hashes of the prompt's full blocks
    blocks: list[torch.Tensor] = field(default_factory=list)  # each [2, L, n, H, D]
    bytes_received: int = 0
    opened: bool = False
    closed: bool = False
    error: str | None = None

    @property
    def end_block(self) -> int:
        return -(-self.num_tokens // self.block_size)

    @property
    def num_expected(self) -> int:
        return self.end_block - self.start_block

    @property
    def complete(self) -> bool:
        return self.closed and self.error is None and len(self.blocks) == self.num_expected

    def open(self, msg: decode_pb2.KvPushOpen) -> None:
        if self.opened:
            raise InvalidArgument(f"request {self.request_id!r}: KV push already opened")
        if msg.num_tokens != self.num_tokens or msg.start_block != self.start_block:
            raise InvalidArgument(
                f"request {self.request_id!r}: push of {msg.num_tokens} tokens from block {msg.start_block}, "
                f"expected {self.num_tokens} tokens from block {self.start_block}"
            )
        self.opened = True

    def add(self, block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> torch.Tensor:
        """Validate one frame against what this request expects, then decode it."""
        h = block.header
        index = self.start_block + len(self.blocks)
        if self.closed or index >= self.end_block:
            raise InvalidArgument(f"request {self.request_id!r}: unexpected KV block {h.block_index}")
        if h.block_index != index:
            raise InvalidArgument(f"request {self.request_id!r}: KV block {h.block_index} out of order, expected {index}")
        want_tokens = min(self.block_size, self.num_tokens - index * self.block_size)
        if h.num_tokens != want_tokens:
            raise InvalidArgument(f"KV block {index}: {h.num_tokens} tokens, expected {want_tokens}")
        want_hash = self.hashes[index] if want_tokens == self.block_size else b""
        if h.block_hash != want_hash:
            raise InvalidArgument(f"KV block {index}: block hash does not match the prompt's tokens")
        kv = kvtensor.decode_block(block, spec)
        self.blocks.append(kv)
        self.bytes_received += kvwire.wire_bytes(block)
        return kv

    def close(self, msg: decode_pb2.KvPushClose) -> None:
        self.closed = True
        if msg.error:
            self.error = msg.error
        elif msg.num_blocks != len(self.blocks) or len(self.blocks) != self.num_expected:
            self.error = f"push closed after {len(self.blocks)} blocks (says {msg.num_blocks}), expected {self.num_expected}"
            raise InvalidArgument(f"request {self.request_id!r}: {self.error}")


class KvReceiver:
    """Pending receives by request id."""

    def __init__(self) -> None:
        self._pending: dict[str, PendingKv] = {}

    def register(self, pending: PendingKv) -> PendingKv:
        if pending.request_id in self._pending:
            raise InvalidArgument(f"request id {pending.request_id!r} is already waiting for KV")
        self._pending[pending.request_id] = pending
        return pending

    def unregister(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def get(self, request_id: str) -> PendingKv:
        pending = self._pending.get(request_id)
        if pending is None:
            raise NotFound(f"no request {request_id!r} is waiting for KV on this worker")
        return pending


def assemble(local: list[torch.Tensor], received: list[torch.Tensor]) -> torch.Tensor:
    """The prompt's KV in token order: local cached blocks then received ones, `[2, L, k, H, D]`."""
    return torch.cat(local + received, dim=2)
