"""BlockManager: exact block ids, ref counts and eviction order."""

from __future__ import annotations

import pytest

from kvmesh.engine.block_manager import BlockManager, NoFreeBlocksError
from kvmesh.runtime.blockhash import BlockHasher

HASHER = BlockHasher("test", "float32", 4)
TOKENS = list(range(100, 116))  # 4 full blocks of 4
HASHES = HASHER.hashes(TOKENS)


def cached(bm: BlockManager, n: int) -> list[int]:
    """Allocate n blocks for TOKENS, register them, free them; return their ids."""
    ids = bm.allocate(n)
    for i, b in enumerate(ids):
        bm.cache_block(b, HASHES[i], TOKENS[i * 4 : (i + 1) * 4])
    bm.free(ids)
    return ids


def test_allocate_hands_out_lowest_ids_first_with_ref_count_one() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.allocate(3) == [0, 1, 2]
    assert [b.ref_count for b in bm.blocks] == [1, 1, 1, 0, 0, 0]
    assert bm.num_free_blocks == 3 and bm.free_block_ids() == [3, 4, 5]


def test_allocating_more_than_free_raises() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(3)


def test_uncached_freed_blocks_are_reused_before_cached_ones() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    assert cached(bm, 2) == [0, 1]  # 0 and 1 now cached + free, at the LRU tail
    assert bm.free_block_ids() == [2, 3, 1, 0]  # tail of the sequence (block 1) is evicted first
    plain = bm.allocate(1)
    bm.free(plain)
    assert bm.free_block_ids() == [2, 3, 1, 0]


def test_eviction_follows_lru_order_and_drops_the_hash() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    cached(bm, 2)  # free order: [2, 1, 0]
    assert bm.allocate(2) == [2, 1]  # block 1 (cached, least recently freed tail) is evicted
    assert bm.match_prefix(HASHES, TOKENS) == [0]  # block 1's hash is gone, so the chain stops after 0
    assert bm.blocks[1].block_hash is None


def test_prefix_hit_requires_matching_tokens() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    cached(bm, 2)
    assert bm.match_prefix(HASHES, TOKENS) == [0, 1]
    wrong = TOKENS[:4] + [0, 0, 0, 0] + TOKENS[8:]
    assert bm.match_prefix(HASHES, wrong) == [0]  # same hash (forged) but different tokens → miss


def test_take_shares_blocks_and_ref_counts() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    cached(bm, 2)
    bm.take([0, 1])
    bm.take([0])
    assert [bm.blocks[i].ref_count for i in (0, 1)] == [2, 1]
    assert bm.free_block_ids() == [2, 3]
    bm.free([0])
    bm.free([0, 1])
    assert bm.free_block_ids() == [2, 3, 1, 0]
    with pytest.raises(RuntimeError):
        bm.free([0])


def test_duplicate_content_is_not_cached_twice() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = bm.allocate(2)
    assert bm.cache_block(a, HASHES[0], TOKENS[:4])
    assert not bm.cache_block(b, HASHES[0], TOKENS[:4])
    assert bm.blocks[b].block_hash is None


def test_import_block_stores_cached_free_block() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    assert bm.import_block(HASHES[0], TOKENS[:4]) == 0
    assert bm.import_block(HASHES[0], TOKENS[:4]) is None  # already cached
    assert bm.blocks[0].ref_count == 0 and bm.free_block_ids() == [1, 2, 0]
    assert bm.lookup(HASHES[0], TOKENS[:4]) == 0


def test_prefix_caching_disabled_never_hits() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    cached(bm, 2)
    assert bm.match_prefix(HASHES, TOKENS) == []
    assert bm.free_block_ids() == [0, 1, 2, 3]  # uncached blocks go back to the front


def test_kv_events_record_stored_chains_and_removals() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    ids = bm.allocate(3)
    for i, b in enumerate(ids):
        bm.cache_block(b, HASHES[i], TOKENS[i * 4 : (i + 1) * 4], HASHES[i - 1] if i else None)
    assert bm.take_events() == [("stored", HASHES[:3], None)]
    assert bm.take_events() == []
    bm.free(ids)
    bm.allocate(2)  # evicts the tail first: blocks 2 then 1
    assert bm.take_events() == [("removed", [HASHES[2], HASHES[1]], None)]


def test_kv_events_overflow_resyncs_with_cleared(monkeypatch) -> None:
    from kvmesh.engine import block_manager

    monkeypatch.setattr(block_manager, "MAX_PENDING_EVENTS", 1)
    bm = BlockManager(num_blocks=2, block_size=4)
    a, b = bm.allocate(2)
    bm.cache_block(a, HASHES[0], TOKENS[:4])
    bm.cache_block(b, HASHES[1], TOKENS[4:8], HASHES[0])
    assert bm.take_events() == [("cleared", [], None), ("stored", [HASHES[0]], None), ("stored", [HASHES[1]], HASHES[0])]
