"""What the store tells KV-event subscribers (turned into `KvEvent` protobufs by the shell)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stored:
    """`hashes` form a chain; `parent` is the block before the first (None = a sequence start or unknown)."""

    hashes: list[bytes]
    parent: bytes | None


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: list[bytes]


@dataclass(frozen=True, slots=True)
class Cleared:
    """Everything the subscriber knew of this store is gone (a restart without a disk tier)."""


StoreEvent = Stored | Removed | Cleared
