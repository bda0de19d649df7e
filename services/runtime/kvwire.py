"""The KV block codec (the only one; numpy, torch-free): one block of K and V `[2, L, n, H, D]` as
model-dtype bytes <-> `common_pb2.KvBlock` (or its serialized frame, `encode_frame` / `read_frame`:
a large block's bytes are joined once and parsed off the event loop), and re-encoding between
encodings (the KV store's cold tier).

Encodings, symmetric quantization after KIVI:
- RAW: the model dtype, little-endian, in `[2, L, n, H, D]` order;
- INT8 / INT4: K (`[0]`) has one scale per channel (layer, head, dim) over the block's tokens,
  V (`[1]`) one scale per token (layer, token, head) over head_dim; `scale = amax / qmax`
  (1 for an all-zero group); `scales` = float32 K scales then V scales; values `round(x / scale)`
  (half to even) clipped to ±qmax; INT4 stores `q + 8` nibbles two per byte, the even element in
  the low nibble (a zero nibble pads an odd count). Decoding is `q * scale`, then rounding to
  the model dtype (bfloat16 round-to-nearest-even).
The receiver validates every header field against its own `ModelSpec` before it reads a byte;
no pickle anywhere. Workers turn tensors into bytes and back in `kvmesh.worker.kvtensor`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import pbframe
from .errors import InvalidArgument
from .pb import common_pb2

RAW = common_pb2.KV_ENCODING_RAW
INT8 = common_pb2.KV_ENCODING_INT8
INT4 = common_pb2.KV_ENCODING_INT4
ENCODING_NAMES = {RAW: "raw", INT8: "int8", INT4: "int4"}
HASH_BYTES = 32

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QMAX = {INT8: 127, INT4: 7}


def encoding_from_name(name: str) -> int:
    """'raw' | 'int8' | 'int4' -> the KvEncoding value."""
    for value, known in ENCODING_NAMES.items():
        if known == name.lower():
            return value
    raise ValueError(f"unknown KV encoding {name!r}: expected one of {sorted(ENCODING_NAMES.values())}")


def encoding_name(encoding: int) -> str:
    """Label for metrics and spans; UNSPECIFIED reads as raw."""
    return ENCODING_NAMES.get(encoding or RAW, f"unknown({encoding})")


def model_spec(model_id: str, model_args: object, dtype: str, block_size: int) -> common_pb2.ModelSpec:
    """The spec both ends of a KV transfer must agree on, from the engine's `ModelArgs`."""
    return common_pb2.ModelSpec(
        model_id=model_id,
        dtype=dtype,
        block_size=block_size,
        num_layers=model_args.num_layers,
        num_kv_heads=model_args.num_kv_heads,
        head_dim=model_args.head_dim,
    )


def check_spec(expected: common_pb2.ModelSpec, got: common_pb2.ModelSpec) -> None:
    """InvalidArgument naming the first field where a peer's spec differs from ours."""
    for name in ("model_id", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim"):
        want, have = getattr(expected, name), getattr(got, name)
        if want != have:
            raise InvalidArgument(f"model spec mismatch: {name}={have!r}, this worker expects {want!r}")


def wire_bytes(block: common_pb2.KvBlock) -> int:
    """The payload's bytes, as its header says (a validated block's are its lengths). NOTE: not
    `len(block.data)`: upb makes a new copy of a bytes field at every read."""
    return block.header.byte_length + block.header.scales_length


def checksum(data: bytes, scales: bytes = b"") -> int:
    """crc32 of a block's data then its scales, as carried in `KvBlockHeader.checksum`."""
    return zlib.crc32(scales, zlib.crc32(data))


def to_float32(data: bytes, dtype: str) -> np.ndarray:
    """Model-dtype bytes as a flat float32 array."""
    if dtype == "float32":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if dtype == "float16":
        return np.frombuffer(data, dtype="<f2").astype(np.float32)
    if dtype == "bfloat16":
        return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"unsupported dtype {dtype!r}")


def from_float32(x: np.ndarray, dtype: str) -> bytes:
    """A float32 array as model-dtype little-endian bytes (round to nearest even)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.astype("<f4").tobytes()
    if dtype == "float16":
        return x.astype("<f2").tobytes()
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        rounded[np.isnan(x)] = 0x7FC0
        return rounded.astype("<u2").tobytes()
    raise ValueError(f"unsupported dtype {dtype!r}")


def quantize(x: np.ndarray, encoding: int) -> tuple[bytes, bytes]:
    """`x [2, L, n, H, D]` float32 → (data, scales) in `encoding` (INT8 or INT4)."""
    qmax32 = np.float32(QMAX[encoding])
    k_scales = np.abs(x[0]).max(axis=1) / qmax32  # [L, H, D]
    v_scales = np.abs(x[1]).max(axis=3) / qmax32  # [L, n, H]
    k_scales = np.where(k_scales > 0, k_scales, np.float32(1.0))
    v_scales = np.where(v_scales > 0, v_scales, np.float32(1.0))
    q = np.stack([x[0] / k_scales[:, None, :, :], x[1] / v_scales[:, :, :, None]])  # [2, L, n, H, D]
    q = np.clip(np.rint(q), -QMAX[encoding], QMAX[encoding]).astype(np.int8).ravel()
    scales = np.concatenate([k_scales.ravel(), v_scales.ravel()]).astype("<f4").tobytes()
    if encoding == INT8:
        return q.tobytes(), scales
    nibbles = (q.astype(np.int16) + 8).astype(np.uint8)  # [N] in 1..15
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes(), scales


def dequantize(data: bytes, scales: bytes, shape: tuple[int, ...], encoding: int) -> np.ndarray:
    """(data, scales) in `encoding` → float32 `[2, L, n, H, D]`."""
    _, num_layers, n, heads, head_dim = shape
    numel = int(np.prod(shape))
    if encoding == INT8:
        q = np.frombuffer(data, dtype=np.int8)
    else:
        packed = np.frombuffer(data, dtype=np.uint8)
        q = np.stack([packed & 0x0F, packed >> 4], axis=1).ravel()[:numel].astype(np.int16) - 8
    q = q.astype(np.float32).reshape(shape)
    all_scales = np.frombuffer(scales, dtype="<f4")
    k_count = num_layers * heads * head_dim
    k_scales = all_scales[:k_count].reshape(num_layers, 1, heads, head_dim)
    v_scales = all_scales[k_count:].reshape(num_layers, n, heads, 1)
    return np.stack([q[0] * k_scales, q[1] * v_scales])


def transcode(data: bytes, scales: bytes, dtype: str, shape: tuple[int, ...], encoding: int, to: int) -> tuple[bytes, bytes]:
    """A block's payload in encoding `to`: RAW → INT8/INT4 quantizes, INT8/INT4 → RAW decodes."""
    encoding, to = encoding or RAW, to or RAW
    if encoding == to:
        return data, scales
    x = to_float32(data, dtype).reshape(shape) if encoding == RAW else dequantize(data, scales, shape, encoding)
    if to == RAW:
        return from_float32(x, dtype), b""
    return quantize(x, to)


def encode_block(
    data: bytes,
    dtype: str,
    shape: tuple[int, ...],
    *,
    encoding: int = RAW,
    block_hash: bytes = b"",
    block_index: int = 0,
    layer_start: int = 0,
) -> common_pb2.KvBlock:
    """One block given as RAW model-dtype bytes of `shape` `[2, L, n, H, D]`, as a wire message in
    `encoding` (full blocks carry their chained hash)."""
    encoding = encoding or RAW
    data, scales = _encoded(data, dtype, shape, encoding)
    return block_message(data, scales, dtype, shape, encoding, block_hash, block_index, layer_start)


def encode_frame(data: pbframe.Buffer, dtype: str, shape: tuple[int, ...], *, encoding: int = RAW, block_hash: bytes = b"",
                 block_index: int = 0, layer_start: int = 0, wrap: bytes = b"") -> tuple[bytes, int]:
    """`encode_block`'s message serialized (`pbframe`: the payload joined in once, from `data`'s
    buffer when RAW), and its payload bytes. `wrap`: the key of the field of an outer message that
    holds the block (`KvPushMessage.block`): the frame is then that outer message."""
    encoding = encoding or RAW
    data, scales = _encoded(data, dtype, shape, encoding)
    header = block_header(len(data), len(scales), checksum(data, scales), dtype, shape, encoding, block_hash, block_index,
                          layer_start)
    return block_frame(header, data, scales, wrap), len(data) + len(scales)


def _encoded(data: pbframe.Buffer, dtype: str, shape: tuple[int, ...], encoding: int) -> tuple[pbframe.Buffer, bytes]:
    """RAW `data` of `shape` checked and transcoded to `encoding` (RAW or another, never 0)."""
    if len(shape) != 5 or shape[0] != 2:
        raise ValueError(f"KV block must be [2, L, n, H, D], got {list(shape)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"KV dtype {dtype} is not one of {sorted(DTYPE_BYTES)}")
    if encoding not in ENCODING_NAMES:
        raise ValueError(f"unknown KV encoding {encoding}")
    return transcode(data, b"", dtype, tuple(shape), RAW, encoding)


def block_header(data_len: int, scales_len: int, crc: int, dtype: str, shape: Sequence[int], encoding: int,
                 block_hash: bytes = b"", block_index: int = 0, layer_start: int = 0) -> common_pb2.KvBlockHeader:
    return common_pb2.KvBlockHeader(
        block_hash=block_hash,
        block_index=block_index,
        layer_start=layer_start,
        layer_end=layer_start + shape[1],
        dtype=dtype,
        shape=list(shape),
        encoding=encoding,
        byte_length=data_len,
        checksum=crc,
        num_tokens=shape[2],
        scales_length=scales_len,
    )


def block_message(data: bytes, scales: bytes, dtype: str, shape: Sequence[int], encoding: int, block_hash: bytes = b"",
                  block_index: int = 0, layer_start: int = 0, crc: int | None = None) -> common_pb2.KvBlock:
    """A block already in `encoding` (`data`, `scales`) as a wire message; `crc`: its checksum
    when the caller has it (else computed)."""
    crc = checksum(data, scales) if crc is None else crc
    header = block_header(len(data), len(scales), crc, dtype, shape, encoding, block_hash, block_index, layer_start)
    return common_pb2.KvBlock(header=header, data=data, scales=scales)


_HEADER, _DATA, _SCALES = pbframe.key(1), pbframe.key(2), pbframe.key(3)  # KvBlock's fields


def block_frame(header: common_pb2.KvBlockHeader, data: pbframe.Buffer, scales: pbframe.Buffer, wrap: bytes = b"") -> bytes:
    """`KvBlock(header, data, scales)` serialized (`pbframe`); `wrap` as in `encode_frame`."""
    head = header.SerializeToString()
    parts = pbframe.pieces(pbframe.field(_HEADER, len(head)) + head, [(_DATA, data), (_SCALES, scales)])
    return b"".join(pbframe.wrapped(wrap, parts) if wrap else parts)


@dataclass(frozen=True, slots=True)
class BlockFrame:
    """A block as its `KvBlock` message's bytes (a KV store's Get answer) and its header, read
    without the payload (`read_frame`). `block()` parses the whole message: do that off the event
    loop, where a 2 MiB block's parse is a copy of ~0.2-1.5 ms (`bench/kvframes.py`)."""

    header: common_pb2.KvBlockHeader
    frame: bytes

    def block(self) -> common_pb2.KvBlock:
        """The whole message; ValueError when it does not parse or its header is not the one read
        first (a second header field, which protobuf merges into the first)."""
        try:
            block = common_pb2.KvBlock.FromString(self.frame)
        except Exception as exc:  # noqa: BLE001 - bytes that do not parse are the sender's fault
            raise ValueError(f"a KV block that does not parse ({type(exc).__name__})") from None
        if block.header != self.header:
            raise ValueError(f"KV block {self.header.block_index}: its header is not the one it starts with")
        return block


def read_frame(frame: bytes) -> BlockFrame:
    """A `KvBlock` message's header, from its first field when that is the header (as protobuf
    writes it: fields in number order), else from a parse of the whole; ValueError when neither parses."""
    try:
        if frame[:1] == _HEADER:
            size, start = pbframe.read_varint(frame, 1)
            if start + size <= len(frame):
                return BlockFrame(common_pb2.KvBlockHeader.FromString(frame[start:start + size]), frame)
        return BlockFrame(common_pb2.KvBlock.FromString(frame).header, frame)
    except Exception as exc:  # noqa: BLE001 - bytes that do not parse are the sender's fault
        raise ValueError(f"a KV block that does not parse ({type(exc).__name__})") from None


def expected_lengths(spec: common_pb2.ModelSpec, num_tokens: int, encoding: int) -> tuple[int, int]:
    """(data bytes, scales bytes) of a block of `num_tokens` tokens in `encoding`."""
    L, H, D = spec.num_layers, spec.num_kv_heads, spec.head_dim
    numel = 2 * L * num_tokens * H * D
    if encoding == RAW:
        return numel * DTYPE_BYTES[spec.dtype], 0
    scales = 4 * (L * H * D + L * num_tokens * H)
    return (numel if encoding == INT8 else (numel + 1) // 2), scales


def validate_block(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> None:
    """Checks every header field against `spec` and the payload lengths and checksum."""
    _validate(block.header, block.data, block.scales, spec)


def _validate(h: common_pb2.KvBlockHeader, data: bytes, scales: bytes, spec: common_pb2.ModelSpec) -> None:
    encoding = h.encoding or RAW
    if encoding not in ENCODING_NAMES:
        raise InvalidArgument(f"KV block {h.block_index}: unknown encoding {h.encoding}")
    if h.dtype != spec.dtype:
        raise InvalidArgument(f"KV block {h.block_index}: dtype {h.dtype!r}, this worker expects {spec.dtype!r}")
    if h.layer_start != 0 or h.layer_end != spec.num_layers:
        raise InvalidArgument(
            f"KV block {h.block_index}: layers [{h.layer_start}, {h.layer_end}), expected all [0, {spec.num_layers})"
        )
    if not 1 <= h.num_tokens <= spec.block_size:
        raise InvalidArgument(f"KV block {h.block_index}: num_tokens {h.num_tokens} not in [1, {spec.block_size}]")
    want_shape = [2, spec.num_layers, h.num_tokens, spec.num_kv_heads, spec.head_dim]
    if list(h.shape) != want_shape:
        raise InvalidArgument(f"KV block {h.block_index}: shape {list(h.shape)}, expected {want_shape}")
    if h.block_hash and len(h.block_hash) != HASH_BYTES:
        raise InvalidArgument(f"KV block {h.block_index}: block_hash has {len(h.block_hash)} bytes, expected {HASH_BYTES}")
    if h.block_hash and h.num_tokens != spec.block_size:
        raise InvalidArgument(f"KV block {h.block_index}: a partial block ({h.num_tokens} tokens) must not carry a hash")
    data_len, scales_len = expected_lengths(spec, h.num_tokens, encoding)
    if h.byte_length != data_len or len(data) != data_len:
        raise InvalidArgument(
            f"KV block {h.block_index}: byte_length {h.byte_length} / data {len(data)} bytes, expected {data_len}"
        )
    if h.scales_length != scales_len or len(scales) != scales_len:
        raise InvalidArgument(
            f"KV block {h.block_index}: scales_length {h.scales_length} / scales {len(scales)} bytes, "
            f"expected {scales_len}"
        )
    if checksum(data, scales) != h.checksum:
        raise InvalidArgument(f"KV block {h.block_index}: checksum mismatch (corrupted payload)")


def decode_block(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> bytes:
    """A validated block as RAW model-dtype bytes (`[2, L, n, H, D]`, shape in its header)."""
    h, data, scales = block.header, block.data, block.scales  # NOTE: read once: each read of a bytes field copies
    _validate(h, data, scales, spec)
    encoding = h.encoding or RAW
    if encoding != RAW and not np.isfinite(np.frombuffer(scales, dtype="<f4")).all():
        raise InvalidArgument(f"KV block {h.block_index}: scales are not all finite")
    return transcode(data, scales, spec.dtype, tuple(h.shape), encoding, RAW)[0]
