"""KV blocks as torch tensors on the workers' side of the one codec (`kvmesh.runtime.kvwire`):
a tensor becomes model-dtype bytes (`torch.frombuffer` on the way back); the codec does the rest.
The workers run `encode_block`/`decode_block` on a `codec_pool()`, never on their event loop."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvmesh.runtime import kvwire
from kvmesh.runtime.kvstoremsgs import BlockRun
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def codec_pool(threads: int = 2, max_pending: int = 8) -> Offload:
    """Threads for KV block encode/decode (crc, copies, (de)quantization), `max_pending` at once."""
    return Offload("kv-codec", threads=threads, max_pending=max_pending)


def byte_view(t: torch.Tensor) -> memoryview:
    """The tensor's elements as a flat little-endian byte buffer (on CPU, contiguous; no copy when it
    already is): the view keeps them alive while it is held."""
    return memoryview(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())


def to_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements as little-endian bytes (copied to CPU, contiguous)."""
    return byte_view(t).tobytes()


def _dtype_name(t: torch.Tensor) -> str:
    """The wire name of `t`'s dtype ("float32", ...); ValueError for one the wire has no name for."""
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"KV dtype {dtype} is not one of {sorted(TORCH_DTYPES)}")
    return dtype


def encode_block(
    kv: torch.Tensor, *, encoding: int = kvwire.RAW, block_hash: bytes = b"", block_index: int = 0, layer_start: int = 0
) -> common_pb2.KvBlock:
    """One block `[2, L, n, H, D]` as a wire message (full blocks carry their chained hash)."""
    return kvwire.encode_block(to_bytes(kv), _dtype_name(kv), tuple(kv.shape), encoding=encoding, block_hash=block_hash,
                               block_index=block_index, layer_start=layer_start)


def encode_frame(kv: torch.Tensor, *, encoding: int = kvwire.RAW, block_hash: bytes = b"", block_index: int = 0,
                 wrap: bytes = b"") -> tuple[bytes, int]:
    """`encode_block`'s message serialized (`kvwire.encode_frame`: the tensor's bytes joined in
    once, not copied before), and its payload bytes; `wrap`: see there."""
    return kvwire.encode_frame(byte_view(kv), _dtype_name(kv), tuple(kv.shape), encoding=encoding, block_hash=block_hash,
                               block_index=block_index, wrap=wrap)


def pack_blocks(kv: torch.Tensor, block_hashes: Sequence[bytes], start: int, dtype: str) -> BlockRun:
    """Consecutive full blocks `[n, 2, L, bs, H, D]` (one tensor) as one RAW run numbered from
    `start`, block i with `block_hashes[i]`: one bytes object and a crc32 a block, where
    `encode_block` makes a message a block. `dtype`: the spec's (ValueError for another)."""
    if _dtype_name(kv) != dtype:
        raise ValueError(f"KV blocks of {_dtype_name(kv)}, the spec says {dtype}")
    return BlockRun.of(to_bytes(kv), block_hashes, start)


def decode_frame(frame: kvwire.BlockFrame, spec: common_pb2.ModelSpec) -> torch.Tensor:
    """`decode_block` of a block still in its bytes (a Get's answer): parsed here, on the codec pool."""
    return decode_block(frame.block(), spec)


_BITS = {2: (torch.int16, "<i2"), 4: (torch.int32, "<i4")}  # a dtype's elements as integers of their size


def decode_block_into(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec, out: torch.Tensor) -> None:
    """`decode_block` written straight into `out` (a CPU view `[2, L, n, H, D]` of the spec's
    dtype, e.g. a prompt's place in a larger buffer): one copy, no tensor made on the way."""
    data = kvwire.decode_block(block, spec)
    if tuple(out.shape) != tuple(block.header.shape) or out.dtype != TORCH_DTYPES[spec.dtype]:
        raise ValueError(f"KV block {list(block.header.shape)} {spec.dtype} into {list(out.shape)} {out.dtype}")
    ints, wire = _BITS[out.element_size()]
    # NOTE: as integers of the same size, so numpy (no bfloat16) copies the bytes into the strided view
    out.view(ints).numpy()[...] = np.frombuffer(data, dtype=wire).reshape(out.shape)


def decode_block(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> torch.Tensor:
    """A validated block as a tensor `[2, L, n, H, D]` in the spec's dtype (CPU)."""
    data = kvwire.decode_block(block, spec)
    return torch.frombuffer(bytearray(data), dtype=TORCH_DTYPES[spec.dtype]).reshape(tuple(block.header.shape))
