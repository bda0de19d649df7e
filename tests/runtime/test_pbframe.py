"""Hand-written protobuf frames parse as protobuf's own messages."""

from __future__ import annotations

import pytest

from kvmesh.runtime import pbframe
from kvmesh.runtime.pb import common_pb2, decode_pb2


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16_383, 16_384, 2**21, 2**35])
def test_varint_is_protobufs(n: int) -> None:
    encoded = common_pb2.KvBlockHeader(byte_length=n).SerializeToString()
    assert encoded == (b"\x40" + pbframe.varint(n) if n else b"")  # byte_length = 8, a varint field


@pytest.mark.parametrize("size", [0, 1, 127, 128, 70_000])
def test_pieces_and_wrapped_make_the_message(size: int) -> None:
    data, scales = bytes(range(256)) * (size // 256) + bytes(size % 256), b"\x01\x02"
    header = common_pb2.KvBlockHeader(block_index=4, dtype="float32")
    head = header.SerializeToString()
    parts = pbframe.pieces(pbframe.field(pbframe.key(1), len(head)) + head,
                           [(pbframe.key(2), memoryview(data)), (pbframe.key(3), scales)])
    assert common_pb2.KvBlock.FromString(b"".join(parts)) == common_pb2.KvBlock(header=header, data=data, scales=scales)
    outer = decode_pb2.KvPushMessage.FromString(b"".join(pbframe.wrapped(pbframe.key(2), parts)))
    assert outer.WhichOneof("msg") == "block" and outer.block.data == data
