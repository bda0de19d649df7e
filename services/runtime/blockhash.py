"""Chained block hashes: the one key every service uses for a block of KV.

`root = sha256(b"kvmesh/v1" + fingerprint)`, where the fingerprint covers model id, dtype and
block size; `hash_i = sha256(hash_{i-1} + tokens_i as little-endian uint32 + tagged extra keys)`.
Only full blocks are hashed. Torch-free so the gateway and scheduler can import it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BLOCK_SIZE = 16
_PREFIX = b"kvmesh/v1"


def model_fingerprint(model_id: str, dtype: str, block_size: int) -> bytes:
    """Bytes that differ whenever two models must not share cached KV."""
    return f"model={model_id}\x00dtype={dtype}\x00block_size={block_size}".encode()


def root_hash(fingerprint: bytes) -> bytes:
    return hashlib.sha256(_PREFIX + fingerprint).digest()


def _tag_extra_keys(extra_keys: Sequence[str | bytes]) -> bytes:
    # NOTE: each extra key is length-prefixed and tagged so ("ab",) never equals ("a", "b").
    out = bytearray()
    for key in extra_keys:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        out += b"x" + struct.pack("<I", len(raw)) + raw
    return bytes(out)


def hash_block(parent: bytes, token_ids: Sequence[int], extra_keys: Sequence[str | bytes] = ()) -> bytes:
    """Hash of one block given its parent's hash and its token ids."""
    packed = struct.pack(f"<{len(token_ids)}I", *token_ids)
    return hashlib.sha256(parent + packed + _tag_extra_keys(extra_keys)).digest()


def chain_hashes(
    root: bytes,
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str | bytes] = (),
) -> list[bytes]:
    """Hashes of every full block of `token_ids`, chained from `root`."""
    hashes: list[bytes] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], extra_keys)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Block hashes for one model: `BlockHasher(model_id, dtype, block_size).hashes(tokens)`."""

    model_id: str
    dtype: str
    block_size: int = DEFAULT_BLOCK_SIZE

    @property
    def root(self) -> bytes:
        return root_hash(model_fingerprint(self.model_id, self.dtype, self.block_size))

    def hashes(self, token_ids: Sequence[int], extra_keys: Sequence[str | bytes] = ()) -> list[bytes]:
        return chain_hashes(self.root, token_ids, self.block_size, extra_keys)

    def extend(self, parent: bytes | None, token_ids: Sequence[int]) -> bytes:
        """Hash of the block `token_ids` following `parent` (None = first block)."""
        return hash_block(self.root if parent is None else parent, token_ids)


def resolve_dtype(setting: str, checkpoint_dtype: str | None) -> str:
    """The dtype name a mesh serves in: 'auto' means the checkpoint's own dtype (float32 when it
    names none), so every service resolves it the same way whatever device it runs on."""
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = checkpoint_dtype or "float32" if setting == "auto" else setting
    name = aliases.get(name, name)
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unsupported dtype {setting!r}: expected auto, float32, bfloat16 or float16")
    return name
