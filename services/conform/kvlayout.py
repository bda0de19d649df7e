"""The KV block wire layout of docs/contracts.md, written again in numpy so the suites check
implementations against the document, not against our codec.

A block is `[2, L, n, H, D]` (K then V, layers, tokens, kv heads, head dim), C order.
RAW: the model dtype's little-endian bytes. INT8/INT4: symmetric, `q = round(x / scale)` clamped
to ±127 / ±7; K scales per (layer, head, dim) over the block's tokens `[L, 1, H, D]`, V scales per
(layer, token, head) over head_dim `[L, n, H, 1]`; `scales` = K's then V's, float32. INT4 packs
`q + 8` two to a byte, the first value in the low nibble, a zero nibble pads an odd count.
checksum = crc32 of data followed by scales.
"""

from __future__ import annotations

import zlib

import numpy as np

from kvmesh.runtime.pb import common_pb2

RAW, INT8, INT4 = common_pb2.KV_ENCODING_RAW, common_pb2.KV_ENCODING_INT8, common_pb2.KV_ENCODING_INT4
QMAX = {INT8: 127, INT4: 7}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def checksum(data: bytes, scales: bytes) -> int:
    return zlib.crc32(data + scales)


def expected_lengths(spec: common_pb2.ModelSpec, num_tokens: int, encoding: int) -> tuple[int, int]:
    """(len(data), len(scales)) of a block of `num_tokens` tokens."""
    L, H, D = spec.num_layers, spec.num_kv_heads, spec.head_dim
    numel = 2 * L * num_tokens * H * D
    if (encoding or RAW) == RAW:
        return numel * ITEMSIZE[spec.dtype], 0
    scales = 4 * (L * H * D + L * num_tokens * H)
    return (numel if encoding == INT8 else (numel + 1) // 2), scales


def _raw_to_f32(data: bytes, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return np.frombuffer(data, "<f4").astype(np.float32)
    if dtype == "float16":
        return np.frombuffer(data, "<f2").astype(np.float32)
    return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)  # bfloat16


def decode(block: common_pb2.KvBlock, shape: list[int], dtype: str) -> np.ndarray:
    """The block's values as float32 `[2, L, n, H, D]`."""
    _, L, n, H, D = shape
    encoding = block.header.encoding or RAW
    if encoding == RAW:
        return _raw_to_f32(block.data, dtype).reshape(shape)
    numel = int(np.prod(shape))
    if encoding == INT8:
        q = np.frombuffer(block.data, np.int8).astype(np.float32)
    else:
        packed = np.frombuffer(block.data, np.uint8)
        nibbles = np.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1)[:numel]
        q = nibbles.astype(np.float32) - 8
    q = q.reshape(shape)
    scales = np.frombuffer(block.scales, "<f4")
    k_scale = scales[: L * H * D].reshape(L, 1, H, D)
    v_scale = scales[L * H * D :].reshape(L, n, H, 1)
    return np.stack([q[0] * k_scale, q[1] * v_scale])


def encode(kv: np.ndarray, encoding: int, block_hash: bytes = b"", block_index: int = 0) -> common_pb2.KvBlock:
    """A float32 block `[2, L, n, H, D]` as a wire message (RAW keeps float32)."""
    kv = np.ascontiguousarray(kv, dtype=np.float32)
    if encoding == RAW:
        data, scales = kv.astype("<f4").tobytes(), b""
    else:
        qmax = QMAX[encoding]
        k_scale = np.abs(kv[0]).max(axis=1, keepdims=True) / qmax      # [L, 1, H, D]
        v_scale = np.abs(kv[1]).max(axis=3, keepdims=True) / qmax      # [L, n, H, 1]
        k_scale = np.where(k_scale > 0, k_scale, 1.0).astype(np.float32)
        v_scale = np.where(v_scale > 0, v_scale, 1.0).astype(np.float32)
        q = np.stack([np.round(kv[0] / k_scale), np.round(kv[1] / v_scale)]).clip(-qmax, qmax).astype(np.int8)
        scales = np.concatenate([k_scale.reshape(-1), v_scale.reshape(-1)]).astype("<f4").tobytes()
        if encoding == INT8:
            data = q.tobytes()
        else:
            nibbles = (q.reshape(-1).astype(np.int16) + 8).astype(np.uint8)
            if nibbles.size % 2:
                nibbles = np.concatenate([nibbles, np.zeros(1, np.uint8)])
            data = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes()
    header = common_pb2.KvBlockHeader(
        block_hash=block_hash, block_index=block_index, layer_start=0, layer_end=kv.shape[1], dtype="float32",
        shape=list(kv.shape), encoding=encoding, byte_length=len(data), checksum=checksum(data, scales),
        num_tokens=kv.shape[2], scales_length=len(scales),
    )
    return common_pb2.KvBlock(header=header, data=data, scales=scales)


def tolerance(kv: np.ndarray, encoding: int) -> float:
    """Largest error a correct quantization may leave: half a step of the coarsest scale."""
    if (encoding or RAW) == RAW:
        return 0.0
    return float(np.abs(kv).max()) / QMAX[encoding] * 0.5 + 1e-6


def header_problem(block: common_pb2.KvBlock, spec: common_pb2.ModelSpec, encoding: int) -> str:
    """What is wrong with a block's header against `spec` (empty when nothing is)."""
    h = block.header
    if (h.encoding or RAW) != (encoding or RAW):
        return f"block {h.block_index}: encoding {h.encoding}, expected {encoding}"
    if h.dtype != spec.dtype:
        return f"block {h.block_index}: dtype {h.dtype!r}, spec says {spec.dtype!r}"
    if (h.layer_start, h.layer_end) != (0, spec.num_layers):
        return f"block {h.block_index}: layers [{h.layer_start}, {h.layer_end}), expected [0, {spec.num_layers})"
    want = [2, spec.num_layers, h.num_tokens, spec.num_kv_heads, spec.head_dim]
    if list(h.shape) != want:
        return f"block {h.block_index}: shape {list(h.shape)}, expected {want}"
    data_len, scales_len = expected_lengths(spec, h.num_tokens, encoding)
    if (len(block.data), len(block.scales)) != (data_len, scales_len) or h.byte_length != data_len or h.scales_length != scales_len:
        return (f"block {h.block_index}: data/scales {len(block.data)}/{len(block.scales)} bytes "
                f"(header {h.byte_length}/{h.scales_length}), layout says {data_len}/{scales_len}")
    if h.checksum != checksum(block.data, block.scales):
        return f"block {h.block_index}: checksum does not match crc32(data + scales)"
    return ""
