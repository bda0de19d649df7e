"""Protobuf messages written by hand around a large payload.

upb's serializer copies a large `bytes` field several times: a 2 MiB `KvBlock` took ~0.8 ms to
serialize where one copy of its payload takes ~0.17 (`bench/kvframes.py`). A frame here is the
message's small fields serialized by protobuf, and the payload's key, length and bytes, joined
once. Fields may come in any order on the wire, so any parser reads a frame as the message the
same fields would make.
"""

from __future__ import annotations

from collections.abc import Sequence

Buffer = bytes | memoryview  # a payload: bytes, or a view of memory it is joined from (no copy before the join)


def varint(n: int) -> bytes:
    """`n` (≥ 0) as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `buf[pos:]` and where it ends; ValueError when it runs past the end."""
    value, shift = 0, 0
    while pos < len(buf) and shift < 64:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def key(number: int) -> bytes:
    """The key of length-delimited field `number` (bytes, string or a message)."""
    return varint(number << 3 | 2)


def field(tag: bytes, payload_len: int) -> bytes:
    """A length-delimited field's key (`tag`) and length; the payload follows."""
    return tag + varint(payload_len)


def pieces(head: bytes, payloads: Sequence[tuple[bytes, Buffer]]) -> list[Buffer]:
    """A message as pieces to join: `head` (its other fields, serialized), then each non-empty
    (key, payload) as a length-delimited field. Empty payloads are left out, as proto3 does."""
    parts: list[Buffer] = [head]
    for tag, payload in payloads:
        if len(payload):
            parts += [field(tag, len(payload)), payload]
    return parts


def wrapped(tag: bytes, parts: list[Buffer]) -> list[Buffer]:
    """`parts` (one message) as the payload of field `tag` of an outer message."""
    return [field(tag, sum(len(p) for p in parts)), *parts]
