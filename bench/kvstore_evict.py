"""The KV store's cost a put once its memory tier is full, as it is now against as it was.

    .venv/bin/python bench/kvstore_evict.py [--blocks 20000] [--chain 24] [--puts 3000]

A full memory tier (`--blocks` of them), then `--puts` turns like a multi-turn trace's hand-back: a
lookup of a shared system prompt and the session's earlier turns, then a put of `--chain` new blocks
after them, each put evicting as many. Run three times on the real BlockStore, side by side:
- now: a chain used deepest first, so each parent stays more recently used than its children and the
  LRU end is a leaf (`kvstore/index.py`), and the pinned bytes kept as a running count;
- root-first: every chain touched root first, as before, where the leaves-first victim search walks
  past a chain's ancestors for every block it evicts;
- before: that, and the pinned bytes summed over every entry on each put that must evict, as before.
Prints µs of CPU per put and per evicted block for each, and the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from kvmesh.kvstore.blocks import ModelSpec, make_block
from kvmesh.kvstore.index import TierIndex
from kvmesh.kvstore.store import BlockStore, StoreConfig

SPEC = ModelSpec("bench", "float32", block_size=4, num_layers=1, num_kv_heads=1, head_dim=4)
PAYLOAD = bytes(SPEC.raw_block_bytes)
SYSTEM_PROMPTS, SYSTEM_BLOCKS, SESSIONS = 8, 48, 256


def h(*parts: object) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def root_first(index: TierIndex, chain, now: float) -> None:  # noqa: ANN001 - the order before
    for entry in chain:
        index.touch(entry, now)


def put(store: BlockStore, parent: bytes | None, hashes: list[bytes], start: int) -> None:
    put_id = store.open_put(SPEC, "bench", parent)
    for i, block_hash in enumerate(hashes):
        store.stage(put_id, make_block(SPEC, block_hash, start + i, PAYLOAD))
    store.commit(put_id, len(hashes))


def run(blocks: int, chain: int, puts: int, order: str) -> tuple[float, int]:
    """CPU seconds of the measured puts (and their lookups), and the blocks they evicted."""
    store = BlockStore(StoreConfig(memory_bytes=blocks * SPEC.raw_block_bytes, block_size=SPEC.block_size), time.monotonic)
    if order in ("root-first", "before"):
        store.index.touch_chain = lambda entries, now: root_first(store.index, entries, now)
    if order == "before":
        commit = store.commit

        def scanning_commit(put_id: str, num_blocks: int):  # noqa: ANN202
            sum(e.nbytes for e in store.index.entries.values() if e.pins)  # what a full store's put summed
            return commit(put_id, num_blocks)
        store.commit = scanning_commit
    rng = random.Random(0)
    systems = [[h("system", s, i) for i in range(SYSTEM_BLOCKS)] for s in range(SYSTEM_PROMPTS)]
    for s in systems:
        put(store, None, s, 0)
    sessions = [list(systems[rng.randrange(SYSTEM_PROMPTS)]) for _ in range(SESSIONS)]

    def turn(n: int) -> None:
        k = rng.randrange(SESSIONS)
        history = sessions[k]
        held = store.lookup(SPEC, history, lease_s=-1).num_blocks
        new = [h("turn", n, i) for i in range(chain)]
        put(store, history[held - 1] if held else None, new, held)
        sessions[k] = history[:held] + new if len(history) < 400 else list(systems[rng.randrange(SYSTEM_PROMPTS)])

    n = 0
    while store.stats()[0].blocks < blocks:  # fill the memory tier
        turn(n)
        n += 1
    evicted = store.stats()[0].evictions.get("lru", 0)
    t0 = time.process_time()
    for i in range(puts):
        turn(n + i)
    return time.process_time() - t0, store.stats()[0].evictions.get("lru", 0) - evicted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=20000, help="the memory tier's size in blocks")
    p.add_argument("--chain", type=int, default=24, help="new blocks a put (a turn's hand-back)")
    p.add_argument("--puts", type=int, default=3000)
    args = p.parse_args()
    figures = {}
    for order in ("now", "root-first", "before"):
        cpu_s, evicted = run(args.blocks, args.chain, args.puts, order)
        figures[order] = cpu_s
        print(f"{order:10s} {cpu_s / args.puts * 1e6:8.1f} µs a put (its lookup included), "
              f"{cpu_s / max(evicted, 1) * 1e6:6.1f} µs an evicted block ({evicted} evicted)")
    print(f"CPU a put against now: root-first {figures['root-first'] / figures['now']:.2f}x, "
          f"before {figures['before'] / figures['now']:.2f}x")


if __name__ == "__main__":
    main()
