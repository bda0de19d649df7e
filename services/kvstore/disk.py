"""The disk tier's file format: one self-describing, checksummed file per block.

File `<namespace>-<hash hex>.kvb`:
    b"KVMBLK01" | u32 header length | header (JSON, utf-8) | data | scales | u32 crc32 of all before it
Files are written to a temporary name and renamed, so a reader never sees half a block; a file
that is truncated or whose checksum does not verify is dropped (deleted), never served.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from .blocks import Block, BlockHeader, BlockKey, Encoding, checksum

MAGIC = b"KVMBLK01"
SUFFIX = ".kvb"
TMP_PREFIX = ".tmp-"
_LEN = struct.Struct("<I")


class CorruptBlockFile(Exception):
    """A block file that cannot be trusted: truncated, unparsable or failing its checksum."""


@dataclass(frozen=True, slots=True)
class DiskRecord:
    """What the index keeps about a block file (the payload stays on disk)."""

    key: BlockKey
    parent: bytes | None
    header: BlockHeader
    file_bytes: int


def file_name(key: BlockKey) -> str:
    namespace, block_hash = key
    return f"{namespace}-{block_hash.hex()}{SUFFIX}"


def encode_file(key: BlockKey, parent: bytes | None, block: Block) -> bytes:
    """The bytes of one block file."""
    h = block.header
    meta = {
        "namespace": key[0], "block_hash": h.block_hash.hex(), "parent": parent.hex() if parent else "",
        "block_index": h.block_index, "layer_start": h.layer_start, "layer_end": h.layer_end,
        "dtype": h.dtype, "shape": list(h.shape), "encoding": int(h.encoding), "byte_length": h.byte_length,
        "checksum": h.checksum, "num_tokens": h.num_tokens, "scales_length": h.scales_length,
    }
    head = json.dumps(meta, separators=(",", ":")).encode()
    body = MAGIC + _LEN.pack(len(head)) + head + block.data + block.scales
    return body + _LEN.pack(zlib.crc32(body))


def decode_file(raw: bytes) -> tuple[DiskRecord, Block]:
    """Parses and verifies one block file; raises CorruptBlockFile."""
    fixed = len(MAGIC) + _LEN.size
    if len(raw) < fixed + _LEN.size or raw[: len(MAGIC)] != MAGIC:
        raise CorruptBlockFile("bad magic or too short")
    (crc,) = _LEN.unpack_from(raw, len(raw) - _LEN.size)
    if zlib.crc32(raw[: -_LEN.size]) != crc:
        raise CorruptBlockFile("file checksum mismatch")
    (head_len,) = _LEN.unpack_from(raw, len(MAGIC))
    try:
        meta = json.loads(raw[fixed : fixed + head_len])
        header = BlockHeader(
            block_hash=bytes.fromhex(meta["block_hash"]), block_index=int(meta["block_index"]),
            layer_start=int(meta["layer_start"]), layer_end=int(meta["layer_end"]), dtype=str(meta["dtype"]),
            shape=tuple(int(s) for s in meta["shape"]), encoding=Encoding(int(meta["encoding"])),
            byte_length=int(meta["byte_length"]), checksum=int(meta["checksum"]),
            num_tokens=int(meta["num_tokens"]), scales_length=int(meta["scales_length"]),
        )
        key = (str(meta["namespace"]), header.block_hash)
        parent = bytes.fromhex(meta["parent"]) or None
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptBlockFile(f"bad header: {exc}") from exc
    start = fixed + head_len
    if start + header.byte_length + header.scales_length != len(raw) - _LEN.size:
        raise CorruptBlockFile("payload length does not match the header")
    data = raw[start : start + header.byte_length]
    scales = raw[start + header.byte_length : start + header.byte_length + header.scales_length]
    if checksum(data, scales) != header.checksum:
        raise CorruptBlockFile("block checksum mismatch")
    return DiskRecord(key, parent, header, len(raw)), Block(header, data, scales)


class DiskDir:
    """Block files in one directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, key: BlockKey) -> Path:
        return self.directory / file_name(key)

    def write(self, key: BlockKey, parent: bytes | None, block: Block) -> DiskRecord:
        raw = encode_file(key, parent, block)
        final = self.path(key)
        tmp = final.with_name(TMP_PREFIX + final.name)
        tmp.write_bytes(raw)
        os.replace(tmp, final)
        return DiskRecord(key, parent, block.header, len(raw))

    def read(self, key: BlockKey) -> Block:
        """The block stored under `key`; raises CorruptBlockFile (or FileNotFoundError)."""
        record, block = decode_file(self.path(key).read_bytes())
        if record.key != key:
            raise CorruptBlockFile("file holds another block")
        return block

    def delete(self, key: BlockKey) -> None:
        self.path(key).unlink(missing_ok=True)

    def scan(self) -> tuple[list[DiskRecord], int]:
        """Every verified block file (oldest first) and how many bad files were deleted."""
        records: list[tuple[float, DiskRecord]] = []
        dropped = 0
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(TMP_PREFIX):
                path.unlink(missing_ok=True)  # an interrupted write
                continue
            if path.suffix != SUFFIX or not path.is_file():
                continue
            try:
                record, _ = decode_file(path.read_bytes())
                if path.name != file_name(record.key):
                    raise CorruptBlockFile("file name does not match its block")
            except CorruptBlockFile:
                path.unlink(missing_ok=True)
                dropped += 1
                continue
            records.append((path.stat().st_mtime, record))
        records.sort(key=lambda item: item[0])
        return [record for _, record in records], dropped
