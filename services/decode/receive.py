"""Receiving pushed KV: one `PendingKv` per request waiting for its prompt's blocks.

A decode worker registers a pending receive before it asks a prefill worker for the KV; the
PushKv stream fills it block by block, each frame validated (spec, index, token count, chained
hash, checksum) before its bytes are read. Blocks land in ONE buffer the size of the prompt's KV
(`kv`), at their token offsets; the local cached prefix is copied into its head when the request
is added (`fill_prefix`): no list of blocks kept and copied again by a concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmesh.worker import kvtensor
from kvmesh.runtime.errors import InvalidArgument, NotFound
from kvmesh.runtime.grpcutil import parse_request
from kvmesh.runtime.pb import common_pb2, decode_pb2


@dataclass(slots=True)
class PendingKv:
    """The KV of prompt tokens [start_block * block_size, num_tokens) as it arrives."""

    request_id: str
    num_tokens: int  # len(prompt) - 1
    start_block: int
    block_size: int
    hashes: list[bytes]  # chained hashes of the prompt's full blocks
    kv: torch.Tensor | None = None  # [2, L, num_tokens, H, D] once the push opened
    num_received: int = 0
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
        return self.closed and self.error is None and self.num_received == self.num_expected

    def open(self, msg: decode_pb2.KvPushOpen) -> None:
        """The push's open (its spec already checked against the worker's): `kv` is made for the
        blocks to land in."""
        if self.opened:
            raise InvalidArgument(f"request {self.request_id!r}: KV push already opened")
        if msg.num_tokens != self.num_tokens or msg.start_block != self.start_block:
            raise InvalidArgument(
                f"request {self.request_id!r}: push of {msg.num_tokens} tokens from block {msg.start_block}, "
                f"expected {self.num_tokens} tokens from block {self.start_block}"
            )
        spec = msg.spec
        self.kv = torch.empty((2, spec.num_layers, self.num_tokens, spec.num_kv_heads, spec.head_dim),
                              dtype=kvtensor.TORCH_DTYPES[spec.dtype])
        self.opened = True

    def check(self, block: common_pb2.KvBlock) -> int:
        """Validate one frame's header against what this request expects; its block index."""
        h = block.header
        index = self.start_block + self.num_received
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
        return index

    def fill(self, block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> None:
        """The codec pool: `check`s the block and decodes it into its place in `kv`. Its counts
        are the event loop's (`received`), so they do not move while a block is being filled."""
        start = self.check(block) * self.block_size
        kvtensor.decode_block_into(block, spec, self.kv[:, :, start : start + block.header.num_tokens])

    def received(self, wire_bytes: int) -> None:
        """A block `fill`ed."""
        self.num_received += 1
        self.bytes_received += wire_bytes

    def close(self, msg: decode_pb2.KvPushClose) -> None:
        self.closed = True
        if msg.error:
            self.error = msg.error
        elif msg.num_blocks != self.num_received or self.num_received != self.num_expected:
            self.error = f"push closed after {self.num_received} blocks (says {msg.num_blocks}), expected {self.num_expected}"
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


def read_push(frame: bytes, spec: common_pb2.ModelSpec, pending: PendingKv) -> decode_pb2.KvPushMessage:
    """Codec pool: one PushKv message's bytes parsed, and a block checked and decoded into its
    place (`PendingKv.fill`). PushKv's requests come unparsed (`DecodeServicer.RAW_REQUESTS`): a
    2 MiB block's parse, each read of its payload and its copy into the prompt's buffer are a copy,
    ~0.2 ms each, that would all hold the event loop."""
    msg = parse_push(frame)
    if msg.WhichOneof("msg") == "block":
        pending.fill(msg.block, spec)
    return msg


def parse_push(frame: bytes) -> decode_pb2.KvPushMessage:
    return parse_request(decode_pb2.KvPushMessage, frame)


def fill_prefix(kv: torch.Tensor, local: list[torch.Tensor]) -> torch.Tensor:
    """`kv` (`[2, L, k, H, D]`, received blocks in place) with the local cached blocks (each
    `[2, L, block_size, H, D]`) copied into its head, in token order."""
    start = 0
    for block in local:
        kv[:, :, start : start + block.shape[2]].copy_(block)
        start += block.shape[2]
    return kv
