"""What the store's calls return, and the counters behind its Stats and metrics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LookupResult:
    num_blocks: int
    lease_id: str = ""
    expires_in_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PutResult:
    stored: int
    duplicates: int


@dataclass(frozen=True, slots=True)
class TierStats:
    name: str
    blocks: int
    bytes: int
    capacity_bytes: int
    evictions: dict[str, int]  # by reason: lru | idle | demote | corrupt


@dataclass(slots=True)
class Counters:
    lookups: int = 0  # chains looked up (a Lookup is one, a LookupChains one per chain)
    lookup_calls: int = 0  # Lookup and LookupChains calls
    lookup_hit_blocks: int = 0
    lookup_query_blocks: int = 0
    puts: int = 0
    gets: int = 0
    get_bytes: int = 0
    put_bytes: int = 0
    evictions: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
