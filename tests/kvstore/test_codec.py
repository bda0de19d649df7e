"""int8 / int4 encodings: layout, accuracy and round trips through the model dtypes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvmesh.kvstore import codec
from kvmesh.runtime import kvwire
from kvmesh.kvstore.blocks import Encoding, check_block, make_block

from .conftest import SPEC, block, h


def values(b):
    return kvwire.to_float32(b.data, b.header.dtype).reshape(b.header.shape)


@pytest.mark.parametrize("encoding, tolerance", [(Encoding.INT8, 0.5 / 127), (Encoding.INT4, 0.5 / 7)])
def test_quantized_block_is_valid_and_within_half_a_step(encoding, tolerance):
    raw = block("a")
    encoded = codec.convert(raw, encoding)
    check_block(SPEC, encoded)  # lengths, checksum and header agree
    decoded = codec.convert(encoded, Encoding.RAW)
    x, y = values(raw), values(decoded)  # [2, L, n, H, D]
    k_bound = np.abs(x[0]).max(axis=1, keepdims=True) * tolerance  # per channel, over tokens
    v_bound = np.abs(x[1]).max(axis=3, keepdims=True) * tolerance  # per token, over head_dim
    assert np.all(np.abs(x[0] - y[0]) <= k_bound + 1e-6)
    assert np.all(np.abs(x[1] - y[1]) <= v_bound + 1e-6)


def test_int8_scales_are_k_per_channel_then_v_per_token():
    raw = block("a")
    x = values(raw)
    encoded = codec.convert(raw, Encoding.INT8)
    scales = np.frombuffer(encoded.scales, dtype="<f4")
    k_scales, v_scales = scales[: 2 * 2 * 4].reshape(2, 2, 4), scales[2 * 2 * 4 :].reshape(2, 4, 2)
    np.testing.assert_allclose(k_scales, np.abs(x[0]).max(axis=1) / 127, rtol=1e-6)
    np.testing.assert_allclose(v_scales, np.abs(x[1]).max(axis=3) / 127, rtol=1e-6)
    q = np.frombuffer(encoded.data, dtype=np.int8).reshape(x.shape)
    assert np.abs(q).max() == 127


def test_an_all_zero_block_round_trips_to_zeros():
    zero = make_block(SPEC, h("z"), 0, bytes(SPEC.raw_block_bytes))
    for encoding in (Encoding.INT8, Encoding.INT4):
        assert codec.convert(codec.convert(zero, encoding), Encoding.RAW).data == zero.data


def test_int4_packs_the_even_element_in_the_low_nibble():
    x = np.zeros(SPEC.block_shape, dtype=np.float32)
    x[0, 0, 0, 0, 0], x[0, 0, 0, 0, 1] = 1.0, -1.0  # K channels scale 1/7 each
    x[0, 0, 1, 0, 0], x[0, 0, 1, 0, 1] = 1.0, -1.0
    data, _ = kvwire.quantize(x, int(Encoding.INT4))
    assert data[0] == (7 + 8) | ((-7 + 8) << 4)  # stored as q + 8


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_blocks_convert_through_float32(dtype):
    spec = dataclasses.replace(SPEC, dtype=dtype)
    raw = block("a", spec=spec)
    assert len(raw.data) == spec.raw_block_bytes
    # decoding an exactly representable value gives the same bytes back
    assert kvwire.from_float32(kvwire.to_float32(raw.data, dtype), dtype) == raw.data
    back = codec.convert(codec.convert(raw, Encoding.INT8), Encoding.RAW)
    check_block(spec, back)
    np.testing.assert_allclose(values(back), values(raw), atol=0.05)


def test_bfloat16_rounds_to_nearest_even():
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8], dtype=np.float32)  # halfway cases
    out = np.frombuffer(kvwire.from_float32(x, "bfloat16"), dtype="<u2")
    assert list(out) == [0x3F80, 0x3F82]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("encoding", [Encoding.INT8, Encoding.INT4])
def test_the_store_and_the_workers_tensor_side_agree_byte_for_byte(dtype, encoding):
    torch = pytest.importorskip("torch")
    from kvmesh.worker import kvtensor  # noqa: PLC0415

    spec = dataclasses.replace(SPEC, dtype=dtype)
    raw = block("a", spec=spec)
    kv = torch.frombuffer(bytearray(raw.data), dtype=kvtensor.TORCH_DTYPES[dtype]).reshape(spec.block_shape)
    kv[0, 1, :, 1, 2] = 0  # an all-zero K channel
    raw = make_block(spec, raw.header.block_hash, 0, kvtensor.to_bytes(kv))
    theirs = kvtensor.encode_block(kv, encoding=int(encoding), block_hash=raw.header.block_hash)
    ours = codec.convert(raw, encoding)
    assert (ours.data, ours.scales, ours.header.checksum) == (theirs.data, theirs.scales, theirs.header.checksum)
    decoded = kvtensor.decode_block(theirs, kvwire.model_spec("m", _Args(), dtype, SPEC.block_size))
    assert codec.convert(ours, Encoding.RAW).data == kvtensor.to_bytes(decoded)


class _Args:
    num_layers, num_kv_heads, head_dim = SPEC.num_layers, SPEC.num_kv_heads, SPEC.head_dim
