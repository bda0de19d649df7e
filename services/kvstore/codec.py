"""int8 / int4 block encodings in numpy (the store needs no torch).

Layout, shared with the wire (`KvEncoding` in common.proto) - symmetric quantization after KIVI:
- a RAW block is `[2, L, n, H, D]` in the model dtype, little-endian;
- K (`[0]`, `[L, n, H, D]`) has one scale per channel, taken over the tokens: `k_scales [L, H, D]`;
- V (`[1]`, `[L, n, H, D]`) has one scale per token, taken over head_dim: `v_scales [L, n, H]`;
- `scales` = float32 little-endian `k_scales` then `v_scales`; `scale = amax / qmax` (1 for an all-zero group);
- INT8 data: int8 values `round(x / scale)` (half to even) clipped to ±qmax, in `[2, L, n, H, D]` order;
- INT4 data: the same with qmax 7, stored as `q + 8` nibbles packed two per byte, the even element in
  the low nibble (a zero nibble pads an odd count).
This is byte-for-byte what the workers' torch codec (`kvmesh.runtime.kvwire`) produces.
Decoding is `q * scale`, then rounding to the model dtype (bfloat16 round-to-nearest-even).
"""

from __future__ import annotations

import numpy as np

from .blocks import Block, Encoding, with_payload

QMAX = {Encoding.INT8: 127, Encoding.INT4: 7}


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
    """A float32 array as model-dtype little-endian bytes."""
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


def quantize(x: np.ndarray, encoding: Encoding) -> tuple[bytes, bytes]:
    """`x [2, L, n, H, D]` float32 → (data, scales) in `encoding` (INT8 or INT4)."""
    qmax = QMAX[encoding]
    qmax32 = np.float32(qmax)
    k_scales = np.abs(x[0]).max(axis=1) / qmax32  # [L, H, D]
    v_scales = np.abs(x[1]).max(axis=3) / qmax32  # [L, n, H]
    k_scales = np.where(k_scales > 0, k_scales, np.float32(1.0))
    v_scales = np.where(v_scales > 0, v_scales, np.float32(1.0))
    q = np.stack([x[0] / k_scales[:, None, :, :], x[1] / v_scales[:, :, :, None]])  # [2, L, n, H, D]
    q = np.clip(np.rint(q), -qmax, qmax).astype(np.int8).ravel()
    scales = np.concatenate([k_scales.ravel(), v_scales.ravel()]).astype("<f4").tobytes()
    if encoding is Encoding.INT8:
        return q.tobytes(), scales
    nibbles = (q.astype(np.int16) + 8).astype(np.uint8)  # [N] in 1..15
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes(), scales


def dequantize(data: bytes, scales: bytes, shape: tuple[int, ...], encoding: Encoding) -> np.ndarray:
    """(data, scales) in `encoding` → float32 `[2, L, n, H, D]`."""
    _, num_layers, n, heads, head_dim = shape
    numel = int(np.prod(shape))
    if encoding is Encoding.INT8:
        q = np.frombuffer(data, dtype=np.int8)
    else:
        packed = np.frombuffer(data, dtype=np.uint8)
        nibbles = np.stack([packed & 0x0F, packed >> 4], axis=1).ravel()[:numel]
        q = nibbles.astype(np.int16) - 8
    q = q.astype(np.float32).reshape(shape)
    all_scales = np.frombuffer(scales, dtype="<f4")
    k_count = num_layers * heads * head_dim
    k_scales = all_scales[:k_count].reshape(num_layers, 1, heads, head_dim)
    v_scales = all_scales[k_count:].reshape(num_layers, n, heads, 1)
    return np.stack([q[0] * k_scales, q[1] * v_scales])


def convert(block: Block, encoding: Encoding) -> Block:
    """`block` carried in `encoding`; RAW → INT8/INT4 quantizes, INT8/INT4 → RAW decodes to the model dtype."""
    h = block.header
    if h.encoding is encoding:
        return block
    shape = tuple(h.shape)
    if h.encoding is Encoding.RAW:
        x = to_float32(block.data, h.dtype).reshape(shape)
    else:
        x = dequantize(block.data, block.scales, shape, h.encoding)
    if encoding is Encoding.RAW:
        return with_payload(block, Encoding.RAW, from_float32(x, h.dtype), b"")
    data, scales = quantize(x, encoding)
    return with_payload(block, encoding, data, scales)
