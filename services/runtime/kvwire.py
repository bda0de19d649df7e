"""KV block wire codec: one block of K and V `[2, L, n, H, D]` <-> `common_pb2.KvBlock`.

Encodings: RAW (model dtype bytes, little-endian), INT8 and INT4 (symmetric; K with one scale per
channel (layer, head, dim) over the block's tokens, V with one scale per token (layer, token, head)
over head_dim, after KIVI; float32 scales, K's first). The receiver validates every header field
against its own `ModelSpec` before it reads a byte; bytes become tensors with `torch.frombuffer`
only; no pickle anywhere.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from .errors import InvalidArgument
from .pb import common_pb2

RAW = common_pb2.KV_ENCODING_RAW
INT8 = common_pb2.KV_ENCODING_INT8
INT4 = common_pb2.KV_ENCODING_INT4
ENCODING_NAMES = {RAW: "raw", INT8: "int8", INT4: "int4"}
HASH_BYTES = 32

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_QMAX = {INT8: 127, INT4: 7}


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
    return len(block.data) + len(block.scales)


def _checksum(data: bytes, scales: bytes) -> int:
    return zlib.crc32(scales, zlib.crc32(data))


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def _scales(kv: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K: per (layer, head, dim) over tokens -> [L, 1, H, D]; V: per (layer, token, head) -> [L, n, H, 1]."""
    k, v = kv[0].float(), kv[1].float()  # [L, n, H, D]
    k_scale = k.abs().amax(dim=1, keepdim=True) / qmax  # [L, 1, H, D]
    v_scale = v.abs().amax(dim=3, keepdim=True) / qmax  # [L, n, H, 1]
    # NOTE: an all-zero channel gets scale 1 so dequantization stays exact (0 * 1) and finite.
    return torch.where(k_scale > 0, k_scale, 1.0), torch.where(v_scale > 0, v_scale, 1.0)


def _quantize(kv: torch.Tensor, encoding: int) -> tuple[bytes, bytes]:
    qmax = _QMAX[encoding]
    k_scale, v_scale = _scales(kv, qmax)
    q = torch.stack(
        [(kv[0].float() / k_scale).round(), (kv[1].float() / v_scale).round()]
    ).clamp(-qmax, qmax).to(torch.int8)  # [2, L, n, H, D]
    scales = _to_bytes(torch.cat([k_scale.reshape(-1), v_scale.reshape(-1)]))
    if encoding == INT8:
        return _to_bytes(q), scales
    nibbles = (q.reshape(-1) + 8).to(torch.uint8)  # [N] in 1..15
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return _to_bytes(packed), scales


def encode_block(
    kv: torch.Tensor,
    *,
    encoding: int = RAW,
    block_hash: bytes = b"",
    block_index: int = 0,
    layer_start: int = 0,
) -> common_pb2.KvBlock:
    """One block `[2, L, n, H, D]` as a wire message (full blocks carry their chained hash)."""
    if kv.dim() != 5 or kv.shape[0] != 2:
        raise ValueError(f"KV block must be [2, L, n, H, D], got {list(kv.shape)}")
    dtype = str(kv.dtype).removeprefix("torch.")
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"KV dtype {dtype} is not one of {sorted(TORCH_DTYPES)}")
    encoding = encoding or RAW
    if encoding == RAW:
        data, scales = _to_bytes(kv), b""
    elif encoding in _QMAX:
        data, scales = _quantize(kv, encoding)
    else:
        raise ValueError(f"unknown KV encoding {encoding}")
    header = common_pb2.KvBlockHeader(
        block_hash=block_hash,
        block_index=block_index,
        layer_start=layer_start,
        layer_end=layer_start + kv.shape[1],
        dtype=dtype,
        shape=list(kv.shape),
        encoding=encoding,
        byte_length=len(data),
        checksum=_checksum(data, scales),
        num_tokens=kv.shape[2],
        scales_length=len(scales),
    )
    return common_pb2.KvBlock(header=header, data=data, scales=scales)


def expected_lengths(spec: common_pb2.ModelSpec, num_tokens: int, encoding: int) -> tuple[int, int]:
    """(data bytes, scales bytes) of a block of `num_tokens` tokens in `encoding`."""
    L, H, D = spec.num_layers, spec.num_kv_heads, spec.head_dim
    numel = 2 * L * num_tokens * H * D
    if encoding == RAW:
        return numel * TORCH_DTYPES[spec.dtype].itemsize, 0
    scales = 4 * (L * H * D + L * num_tokens * H)
    return (numel if encoding == INT8 else (numel + 1) // 2), scales


def validate_block(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> None:
    """Checks every header field against `spec` and the payload lengths and checksum."""
    h = block.header
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
    if h.byte_length != data_len or len(block.data) != data_len:
        raise InvalidArgument(
            f"KV block {h.block_index}: byte_length {h.byte_length} / data {len(block.data)} bytes, expected {data_len}"
        )
    if h.scales_length != scales_len or len(block.scales) != scales_len:
        raise InvalidArgument(
            f"KV block {h.block_index}: scales_length {h.scales_length} / scales {len(block.scales)} bytes, "
            f"expected {scales_len}"
        )
    if _checksum(block.data, block.scales) != h.checksum:
        raise InvalidArgument(f"KV block {h.block_index}: checksum mismatch (corrupted payload)")


def decode_block(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec) -> torch.Tensor:
    """A validated block as a tensor `[2, L, n, H, D]` in the spec's dtype (CPU)."""
    validate_block(block, spec)
    h = block.header
    shape = tuple(h.shape)
    dtype = TORCH_DTYPES[spec.dtype]
    encoding = h.encoding or RAW
    if encoding == RAW:
        return torch.frombuffer(bytearray(block.data), dtype=dtype).reshape(shape)
    if encoding == INT8:
        q = torch.frombuffer(bytearray(block.data), dtype=torch.int8).reshape(shape).float()
    else:
        packed = torch.frombuffer(bytearray(block.data), dtype=torch.uint8)
        nibbles = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[: h.byte_length * 2]
        q = (nibbles[: _numel(shape)].to(torch.int16) - 8).float().reshape(shape)
    L, n, H, D = shape[1:]
    scales = torch.frombuffer(bytearray(block.scales), dtype=torch.float32)
    if not bool(torch.isfinite(scales).all()):
        raise InvalidArgument(f"KV block {h.block_index}: scales are not all finite")
    k_scale = scales[: L * H * D].reshape(L, 1, H, D)
    v_scale = scales[L * H * D :].reshape(L, n, H, 1)
    return torch.stack([q[0] * k_scale, q[1] * v_scale]).to(dtype)


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out
