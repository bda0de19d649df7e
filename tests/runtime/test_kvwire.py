"""KV wire codec: exact raw round trips, bounded int8/int4 error, and every header check."""

from __future__ import annotations

import zlib

import pytest
import torch

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.runtime.errors import InvalidArgument
from kvmesh.runtime.pb import common_pb2

L, BS, H, D = 2, 4, 2, 8
HASH = bytes(range(32))


def spec(dtype: str = "float32") -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(model_id="tiny", dtype=dtype, block_size=BS, num_layers=L, num_kv_heads=H, head_dim=D)


def kv_block(n: int = BS, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, L, n, H, D, generator=g).to(dtype)  # [2, L, n, H, D]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_raw_round_trip_is_exact(dtype: str) -> None:
    kv = kv_block(dtype=kvtensor.TORCH_DTYPES[dtype])
    msg = kvtensor.encode_block(kv, block_hash=HASH, block_index=3)
    assert msg.header.dtype == dtype
    assert list(msg.header.shape) == [2, L, BS, H, D]
    assert msg.header.byte_length == kv.numel() * kv.element_size()
    out = kvtensor.decode_block(msg, spec(dtype))
    assert out.dtype == kv.dtype
    assert torch.equal(out, kv)


def test_partial_tail_block_round_trips_without_hash() -> None:
    kv = kv_block(n=3)
    msg = kvtensor.encode_block(kv, block_index=5)
    assert msg.header.num_tokens == 3 and msg.header.block_hash == b""
    assert torch.equal(kvtensor.decode_block(msg, spec()), kv)


@pytest.mark.parametrize("encoding,tol", [(kvwire.INT8, 1 / 127), (kvwire.INT4, 1 / 7)])
def test_quantized_error_is_bounded_by_half_a_step(encoding: int, tol: float) -> None:
    kv = kv_block(n=3)
    msg = kvtensor.encode_block(kv, encoding=encoding)
    out = kvtensor.decode_block(msg, spec())
    k_amax = kv[0].abs().amax(dim=1, keepdim=True)  # per channel
    v_amax = kv[1].abs().amax(dim=3, keepdim=True)  # per token
    assert ((out[0] - kv[0]).abs() <= k_amax * tol / 2 + 1e-6).all()
    assert ((out[1] - kv[1]).abs() <= v_amax * tol / 2 + 1e-6).all()
    raw_bytes = kvwire.wire_bytes(kvtensor.encode_block(kv))
    assert kvwire.wire_bytes(msg) < raw_bytes


def test_int8_keeps_zero_blocks_exact() -> None:
    kv = torch.zeros(2, L, BS, H, D)
    assert torch.equal(kvtensor.decode_block(kvtensor.encode_block(kv, encoding=kvwire.INT8), spec()), kv)


def _corrupt(field: str, value) -> common_pb2.KvBlock:
    msg = kvtensor.encode_block(kv_block(), encoding=kvwire.INT8, block_hash=HASH)
    if field == "shape":
        del msg.header.shape[:]
        msg.header.shape.extend(value)
    elif field in ("data", "scales"):
        setattr(msg, field, value(getattr(msg, field)))
    else:
        setattr(msg.header, field, value)
    return msg


def _flip(b: bytes) -> bytes:
    return b[:7] + bytes([b[7] ^ 0x01]) + b[8:]


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("dtype", "bfloat16", "dtype"),
        ("encoding", 9, "encoding"),
        ("layer_start", 1, "layers"),
        ("layer_end", L + 1, "layers"),
        ("num_tokens", BS + 1, "num_tokens"),
        ("num_tokens", 0, "num_tokens"),
        ("num_tokens", BS - 1, "shape"),
        ("shape", [2, L, BS, H, D + 1], "shape"),
        ("shape", [2, L, BS, H], "shape"),
        ("block_hash", b"short", "block_hash"),
        ("byte_length", 12, "byte_length"),
        ("scales_length", 4, "scales_length"),
        ("checksum", 1234, "checksum"),
        ("data", _flip, "checksum"),
        ("scales", _flip, "checksum"),
        ("data", lambda b: b[:-1], "byte_length"),
    ],
)
def test_every_corrupted_field_is_refused(field: str, value, words: str) -> None:
    msg = _corrupt(field, value)
    with pytest.raises(InvalidArgument, match=words):
        kvtensor.decode_block(msg, spec())


def test_a_flipped_raw_byte_is_refused() -> None:
    msg = kvtensor.encode_block(kv_block(), block_hash=HASH)
    msg.data = _flip(msg.data)
    with pytest.raises(InvalidArgument, match="checksum"):
        kvtensor.decode_block(msg, spec())


def test_non_finite_scales_are_refused_even_with_a_matching_checksum() -> None:
    msg = kvtensor.encode_block(kv_block(), encoding=kvwire.INT8)
    msg.scales = torch.full((len(msg.scales) // 4,), float("nan")).numpy().tobytes()
    msg.header.checksum = zlib.crc32(msg.scales, zlib.crc32(msg.data))
    with pytest.raises(InvalidArgument, match="finite"):
        kvtensor.decode_block(msg, spec())


def test_spec_mismatch_names_the_field() -> None:
    other = spec()
    other.head_dim = D * 2
    with pytest.raises(InvalidArgument, match="head_dim"):
        kvwire.check_spec(spec(), other)
    kvwire.check_spec(spec(), spec())


def test_encoding_names() -> None:
    assert kvwire.encoding_from_name("INT8") == kvwire.INT8
    assert kvwire.encoding_name(common_pb2.KV_ENCODING_UNSPECIFIED) == "raw"
    with pytest.raises(ValueError):
        kvwire.encoding_from_name("fp8")


@pytest.mark.parametrize("encoding", [kvwire.RAW, kvwire.INT8, kvwire.INT4])
@pytest.mark.parametrize("n", [BS, 3])
def test_a_frame_parses_to_the_blocks_message(encoding: int, n: int) -> None:
    kv = kv_block(n=n, dtype=torch.bfloat16)
    block_hash = HASH if n == BS else b""
    msg = kvtensor.encode_block(kv, encoding=encoding, block_hash=block_hash, block_index=7)
    frame, nbytes = kvtensor.encode_frame(kv, encoding=encoding, block_hash=block_hash, block_index=7)
    assert common_pb2.KvBlock.FromString(frame) == msg
    assert frame == msg.SerializeToString()  # the fields in protobuf's own order, too
    assert nbytes == len(msg.data) + len(msg.scales) == kvwire.wire_bytes(msg)


def test_a_wrapped_frame_is_the_outer_message() -> None:
    from kvmesh.runtime import pbframe
    from kvmesh.runtime.pb import decode_pb2

    kv = kv_block()
    frame, _ = kvtensor.encode_frame(kv, block_hash=HASH, block_index=2, wrap=pbframe.key(2))
    msg = decode_pb2.KvPushMessage.FromString(frame)
    assert msg == decode_pb2.KvPushMessage(block=kvtensor.encode_block(kv, block_hash=HASH, block_index=2))
    assert torch.equal(kvtensor.decode_block(msg.block, spec()), kv)


def test_a_frame_of_a_non_contiguous_tensor_has_its_elements_in_order() -> None:
    kv = kv_block(n=BS).transpose(3, 4).contiguous().transpose(3, 4)  # same values, other strides
    assert not kv.is_contiguous()
    frame, _ = kvtensor.encode_frame(kv, block_hash=HASH)
    assert torch.equal(kvtensor.decode_block(common_pb2.KvBlock.FromString(frame), spec()), kv)


def test_read_frame_reads_the_header_and_block_parses_the_rest() -> None:
    msg = kvtensor.encode_block(kv_block(), block_hash=HASH, block_index=4)
    frame = kvwire.read_frame(msg.SerializeToString())
    assert frame.header == msg.header and frame.block() == msg


def test_read_frame_of_fields_in_another_order_parses_the_whole() -> None:
    from kvmesh.runtime import pbframe

    msg = kvtensor.encode_block(kv_block(), block_hash=HASH, block_index=4)
    head = msg.header.SerializeToString()
    data_first = b"".join([pbframe.field(pbframe.key(2), len(msg.data)), msg.data, pbframe.field(pbframe.key(1), len(head)), head])
    frame = kvwire.read_frame(data_first)
    assert frame.header == msg.header and frame.block() == msg


def test_a_frame_whose_header_is_overridden_later_is_refused() -> None:
    """protobuf merges a second header field into the first: the header read first is not the
    message's, and a block that says one hash and is another must not pass."""
    from kvmesh.runtime import pbframe

    msg = kvtensor.encode_block(kv_block(), block_hash=HASH, block_index=4)
    other = common_pb2.KvBlockHeader(block_hash=bytes(32)).SerializeToString()
    frame = kvwire.read_frame(msg.SerializeToString() + pbframe.field(pbframe.key(1), len(other)) + other)
    assert frame.header == msg.header
    with pytest.raises(ValueError, match="header"):
        frame.block()


@pytest.mark.parametrize("data", [b"\x0a\xff\xff", b"\x0a\x05ab", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"])
def test_a_frame_that_does_not_parse_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="does not parse"):
        kvwire.read_frame(data)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_decode_block_into_fills_a_place_in_a_larger_buffer(dtype: str) -> None:
    kv = kv_block(n=3, dtype=kvtensor.TORCH_DTYPES[dtype])
    msg = kvtensor.encode_block(kv, encoding=kvwire.INT8 if dtype == "float16" else kvwire.RAW)
    buffer = torch.zeros(2, L, 10, H, D, dtype=kv.dtype)
    kvtensor.decode_block_into(msg, spec(dtype), buffer[:, :, 4:7])  # a strided view
    assert torch.equal(buffer[:, :, 4:7], kvtensor.decode_block(msg, spec(dtype)))
    assert not buffer[:, :, :4].any() and not buffer[:, :, 7:].any()
    with pytest.raises(ValueError, match="into"):
        kvtensor.decode_block_into(msg, spec(dtype), buffer[:, :, 4:8])
