"""What the store holds: model specs, block headers and payloads, and their validation.

A block is the K and V of `block_size` tokens for every layer, logical shape
`[2, num_layers, block_size, num_kv_heads, head_dim]`. The store never interprets the bytes
(except to re-encode them, see `codec.py`); it checks that every header field agrees with the
model spec the producer declared, and that the checksum matches, before accepting anything.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvmesh.runtime.errors import InvalidArgument
from kvmesh.runtime.kvwire import checksum

HASH_BYTES = 32
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Encoding(enum.IntEnum):
    """Same numbers as `kvmesh.v1.KvEncoding` (UNSPECIFIED is read as RAW)."""

    RAW = 1
    INT8 = 2
    INT4 = 3


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a KV producer and consumer agree on; blocks of different specs never mix."""

    model_id: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        return (2, self.num_layers, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def numel(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim

    @property
    def raw_block_bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def namespace(self) -> str:
        """A short stable name for the spec: the store's keys are (namespace, block hash)."""
        text = "\x00".join(
            str(v) for v in (self.model_id, self.dtype, self.block_size, self.num_layers, self.num_kv_heads, self.head_dim)
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class BlockHeader:
    block_hash: bytes
    block_index: int
    layer_start: int
    layer_end: int
    dtype: str
    shape: tuple[int, ...]
    encoding: Encoding
    byte_length: int
    checksum: int
    num_tokens: int
    scales_length: int = 0


@dataclass(frozen=True, slots=True)
class Block:
    header: BlockHeader
    data: bytes
    scales: bytes = b""

    @property
    def nbytes(self) -> int:
        return len(self.data) + len(self.scales)


BlockKey = tuple[str, bytes]  # (spec namespace, block hash)


def make_block(spec: ModelSpec, block_hash: bytes, block_index: int, data: bytes,
               encoding: Encoding = Encoding.RAW, scales: bytes = b"") -> Block:
    """A block with a header filled in from `spec` (for producers and tests)."""
    header = BlockHeader(
        block_hash=block_hash, block_index=block_index, layer_start=0, layer_end=spec.num_layers,
        dtype=spec.dtype, shape=spec.block_shape, encoding=encoding, byte_length=len(data),
        checksum=checksum(data, scales), num_tokens=spec.block_size, scales_length=len(scales),
    )
    return Block(header, data, scales)


def with_payload(block: Block, encoding: Encoding, data: bytes, scales: bytes) -> Block:
    """The same block carried in another encoding (header lengths and checksum updated)."""
    header = replace(block.header, encoding=encoding, byte_length=len(data), scales_length=len(scales),
                     checksum=checksum(data, scales))
    return Block(header, data, scales)


def blocks_of_run(spec: ModelSpec, encoding: Encoding, block_hashes: Sequence[bytes], checksums: Sequence[int],
                  first_index: int, data: bytes, scales: bytes) -> list[Block]:
    """A `KvBlockRun`'s blocks: n = len(block_hashes) full blocks of `spec` in `encoding`, cut from
    `data` and `scales` (n of the spec's lengths each, or InvalidArgument). Each is then staged, and
    so checked, like a block sent alone (`check_block`: its checksum among the rest)."""
    n = len(block_hashes)
    data_len, scales_len = expected_lengths(spec, encoding)
    where = f"run of {n} blocks from block {first_index}"
    if len(checksums) != n:
        raise InvalidArgument(f"{where}: {len(checksums)} checksums")
    if len(data) != n * data_len or len(scales) != n * scales_len:
        raise InvalidArgument(
            f"{where}: {len(data)} data and {len(scales)} scale bytes, expected {n} x {data_len} and {n} x {scales_len} "
            f"for {encoding.name}"
        )
    shape, dtype, layers, tokens = spec.block_shape, spec.dtype, spec.num_layers, spec.block_size
    return [
        Block(
            BlockHeader(block_hash=block_hashes[i], block_index=first_index + i, layer_start=0, layer_end=layers, dtype=dtype,
                        shape=shape, encoding=encoding, byte_length=data_len, checksum=checksums[i], num_tokens=tokens,
                        scales_length=scales_len),
            data[i * data_len:(i + 1) * data_len], scales[i * scales_len:(i + 1) * scales_len],
        )
        for i in range(n)
    ]


def expected_lengths(spec: ModelSpec, encoding: Encoding) -> tuple[int, int]:
    """(data bytes, scales bytes) of one block of `spec` in `encoding`."""
    if encoding is Encoding.RAW:
        return spec.raw_block_bytes, 0
    # NOTE: per-channel K scales [L, H, D] then per-token V scales [L, n, H], float32.
    scales = 4 * spec.num_layers * spec.num_kv_heads * (spec.head_dim + spec.block_size)
    data = spec.numel if encoding is Encoding.INT8 else (spec.numel + 1) // 2
    return data, scales


def check_spec(spec: ModelSpec, block_size: int = 0, max_block_bytes: int = 0) -> ModelSpec:
    """Raises InvalidArgument unless `spec` is complete and (when given) uses the mesh block size."""
    if not spec.model_id:
        raise InvalidArgument("model spec: model_id is empty")
    if spec.dtype not in DTYPE_BYTES:
        raise InvalidArgument(f"model spec: dtype {spec.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    for name in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
        if getattr(spec, name) <= 0:
            raise InvalidArgument(f"model spec: {name} must be positive")
    if block_size and spec.block_size != block_size:
        raise InvalidArgument(f"model spec: block_size {spec.block_size} != the mesh's {block_size}")
    if max_block_bytes and spec.raw_block_bytes > max_block_bytes:
        raise InvalidArgument(f"model spec: a block is {spec.raw_block_bytes} bytes, over the limit of {max_block_bytes}")
    return spec


def _check_hash(h: BlockHeader) -> None:
    if len(h.block_hash) != HASH_BYTES:
        raise InvalidArgument(f"block {h.block_index}: block_hash must be {HASH_BYTES} bytes, got {len(h.block_hash)}")


def _check_checksum(block: Block) -> None:
    if checksum(block.data, block.scales) != block.header.checksum:
        raise InvalidArgument(f"block {block.header.block_index}: checksum mismatch (corrupted frame)")


def check_run_block(block: Block) -> None:
    """What `check_block` checks of a block of a run (`blocks_of_run`) that the run does not
    settle: its hash's length and its checksum."""
    _check_hash(block.header)
    _check_checksum(block)


def check_block(spec: ModelSpec, block: Block) -> Block:
    """Raises InvalidArgument unless every header field agrees with `spec` and the payload."""
    h = block.header
    where = f"block {h.block_index}"
    _check_hash(h)
    if h.dtype != spec.dtype:
        raise InvalidArgument(f"{where}: dtype {h.dtype!r} != the spec's {spec.dtype!r}")
    if tuple(h.shape) != spec.block_shape:
        raise InvalidArgument(f"{where}: shape {list(h.shape)} != expected {list(spec.block_shape)}")
    if h.num_tokens != spec.block_size:
        raise InvalidArgument(f"{where}: num_tokens {h.num_tokens} != block_size {spec.block_size} (full blocks only)")
    if (h.layer_start, h.layer_end) != (0, spec.num_layers):
        raise InvalidArgument(f"{where}: layers [{h.layer_start}, {h.layer_end}) != all {spec.num_layers} layers")
    data_len, scales_len = expected_lengths(spec, h.encoding)
    if h.byte_length != len(block.data) or len(block.data) != data_len:
        raise InvalidArgument(
            f"{where}: byte_length {h.byte_length}, data {len(block.data)} bytes, expected {data_len} for {h.encoding.name}"
        )
    if h.scales_length != len(block.scales) or len(block.scales) != scales_len:
        raise InvalidArgument(
            f"{where}: scales_length {h.scales_length}, scales {len(block.scales)} bytes, expected {scales_len}"
        )
    _check_checksum(block)
    return block
