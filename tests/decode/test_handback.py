"""Hand-back of finished turns to a real KV store: only the blocks it lacks, chained to the block
before them, and turns that wait together in one Put."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from kvmesh.decode.handback import Handback
from kvmesh.decode.main import start
from kvmesh.kvstore.config import KvStoreSettings
from kvmesh.kvstore.main import start as start_store
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvshards import Shard, ShardDirectory, split_by_owner
from kvmesh.runtime.pb import decode_pb2_grpc

from .helpers import BLOCK_SIZE, PROMPT, collect, decode_settings, generate_request

pytestmark = pytest.mark.timeout(120)
PROMPTS = [PROMPT, [7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26, 27]]


@pytest.fixture
async def store():
    running = await start_store(KvStoreSettings(host="127.0.0.1", port=0, metrics_port=-1, nats=False, block_size=BLOCK_SIZE,
                                                store_id="kvstore-test"), StoreMetrics(CollectorRegistry()))
    yield running
    await running.stop()


@pytest.fixture
async def worker():
    """A decode worker without a store of its own: the test hands its turns back itself."""
    app = await start(decode_settings())
    yield app
    await app.stop()


@pytest.fixture
async def pool():
    channels = ChannelPool()
    yield channels
    await channels.close()


def handback_of(worker, store, pool: ChannelPool, window_s: float = 0.05, batch_turns: int = 32,
                max_window_s: float = 0.25, max_queue: int = 16) -> Handback:
    spec = worker.worker.spec
    client = ShardedStore(ShardDirectory([Shard("kvstore-test", store.endpoint)]), pool, spec, 5.0)
    return Handback(client, spec, "d-test", worker.loop, worker.loop.engine.hasher, max_queue=max_queue,
                    window_s=window_s, batch_turns=batch_turns, max_window_s=max_window_s)


async def finished(handback: Handback, store) -> None:
    for _ in range(250):
        if handback._queue.empty() and handback.blocks_stored + handback.blocks_skipped and store.store.open_puts == 0:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    await handback.close()


async def handed_back(worker, store, turns: list[list[int]], pool: ChannelPool) -> Handback:
    """A Handback of `worker` to `store` given `turns` before it starts (so they wait together)."""
    handback = handback_of(worker, store, pool)
    for tokens in turns:
        assert handback.offer(tokens)
    handback.start()
    await finished(handback, store)
    return handback


async def run_turns(worker) -> list[list[int]]:
    turns = []
    async with grpc.aio.insecure_channel(worker.endpoint) as channel:
        for prompt in PROMPTS:
            tokens, _ = await collect(decode_pb2_grpc.DecodeWorkerStub(channel), generate_request(prompt=prompt, max_tokens=4))
            turns.append(prompt + tokens)
    return turns


async def test_turns_waiting_together_share_one_put_and_only_missing_blocks_leave(worker, store, pool):
    turns = await run_turns(worker)
    hasher = worker.loop.engine.hasher
    chains = [hasher.hashes(t) for t in turns]
    first = await handed_back(worker, store, [turns[0][:BLOCK_SIZE]], pool)  # the store holds turn 0's first block
    assert (first.blocks_stored, store.store.counters.puts) == (1, 1)
    handback = await handed_back(worker, store, turns, pool)
    held = set(store.store.held_hashes())
    assert handback.blocks_skipped == 1 and store.store.counters.puts == 2  # three turns, one more Put
    assert handback.blocks_stored == len(held) - 1 and all(c[0] in held for c in chains)
    namespace = next(iter(store.store.index.entries))[0]
    parent = {x: store.store.index.get((namespace, x)).parent for x in held}
    assert parent[chains[0][1]] == chains[0][0]  # the first block sent follows the one the store held
    assert parent[chains[1][0]] is None and parent[chains[2][0]] is None
    assert all(parent[c[i]] == c[i - 1] for c in chains for i in range(1, len(c)) if c[i] in held)


async def test_turns_that_end_within_the_window_join_the_first_ones_put(worker, store, pool):
    turns = await run_turns(worker)
    handback = handback_of(worker, store, pool, window_s=0.5)
    handback.start()
    assert handback.offer(turns[0])
    await asyncio.sleep(0.05)  # the hand-back task has taken turn 0 and waits for company
    assert handback.offer(turns[1]) and handback.offer(turns[2])
    await finished(handback, store)
    assert (store.store.counters.lookups, store.store.counters.puts) == (3, 1)
    assert store.store.counters.lookup_calls == 1  # one LookupChains for the three turns
    assert store.store.active_leases == 0  # a hand-back's lookup pins nothing
    assert handback.blocks_stored == len(store.store.held_hashes()) > 0


async def test_a_queue_of_0_hands_nothing_back_and_a_full_queue_drops(worker, store, pool):
    """handback_queue 0 is off (asyncio's maxsize 0 would be unbounded); past the bound a turn is dropped."""
    turns = await run_turns(worker)
    off = handback_of(worker, store, pool, max_queue=0)
    off.start()
    assert not any(off.offer(tokens) for tokens in turns)
    one = handback_of(worker, store, pool, max_queue=1)  # not started: the first turn stays queued
    assert [one.offer(tokens) for tokens in turns] == [True, False, False] and one.dropped == 2
    await asyncio.sleep(0.3)
    await off.close()
    assert store.store.counters.lookups == store.store.counters.puts == 0


async def offered_over_time(store, handback: Handback, turns, gaps_s: list[float], puts: int) -> None:
    """`turns` offered to a running `handback`, the i-th `gaps_s[i - 1]` after the one before;
    returns once the store has had `puts` Puts (at most ~8 s)."""
    handback.start()
    for i, tokens in enumerate(turns):
        if i:
            await asyncio.sleep(gaps_s[i - 1])
        assert handback.offer(tokens)
    for _ in range(400):
        if store.store.counters.puts >= puts and store.store.open_puts == 0 and handback.blocks_stored:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    await handback.close()


@pytest.mark.parametrize(("max_window_s", "gaps_s", "puts"), [
    (30.0, [0.6, 0.6], 1),  # each within the 1 s window of the one before, the last 1.2 s after the first: one Put
    (1.2, [0.8, 0.8], 2),  # the same, but the batch goes 1.2 s after its first: the third turn in a Put of its own
])
async def test_turns_that_keep_ending_join_the_batch_past_its_window_up_to_its_max(worker, store, pool, max_window_s,
                                                                                   gaps_s, puts):
    turns = await run_turns(worker)
    handback = handback_of(worker, store, pool, window_s=1.0, max_window_s=max_window_s)
    await offered_over_time(store, handback, turns, gaps_s, puts)
    assert (store.store.counters.lookup_calls, store.store.counters.puts) == (puts, puts)
    assert handback.blocks_stored == len(store.store.held_hashes()) > 0


async def test_a_batch_goes_once_batch_turns_turns_wait_not_at_the_end_of_its_window(worker, store, pool):
    turns = await run_turns(worker)
    handback = handback_of(worker, store, pool, window_s=30.0, batch_turns=3, max_window_s=30.0)
    handback.start()
    assert handback.offer(turns[0])
    await asyncio.sleep(0.05)  # the hand-back task has taken turn 0 and waits for company
    assert handback.offer(turns[1])
    await asyncio.sleep(0.3)
    assert store.store.counters.puts == 0  # two of three: still waiting
    assert handback.offer(turns[2])
    for _ in range(250):  # NOTE: well before the 30 s window ends
        if handback.blocks_stored and store.store.open_puts == 0:  # NOTE: the worker has the Put's answer too
            break
        await asyncio.sleep(0.02)
    await handback.close()
    assert (store.store.counters.lookup_calls, store.store.counters.puts) == (1, 1)  # the three turns together
    assert handback.blocks_stored == len(store.store.held_hashes()) > 0


async def test_a_batch_asks_each_shard_once_whatever_its_number_of_turns(worker, store, pool):
    second = await start_store(KvStoreSettings(host="127.0.0.1", port=0, metrics_port=-1, nats=False, block_size=BLOCK_SIZE,
                                               store_id="kvstore-test-1"), StoreMetrics(CollectorRegistry()))
    turns = await run_turns(worker)
    try:
        spec = worker.worker.spec
        shards = ShardDirectory([Shard("kvstore-test", store.endpoint), Shard("kvstore-test-1", second.endpoint)])
        handback = Handback(ShardedStore(shards, pool, spec, 5.0), spec, "d-test", worker.loop, worker.loop.engine.hasher)
        for tokens in turns:
            assert handback.offer(tokens)
        handback.start()
        for _ in range(250):
            if handback.blocks_stored and store.store.open_puts == second.store.open_puts == 0:
                break
            await asyncio.sleep(0.02)
        await handback.close()
    finally:
        await second.stop()
    stores = [store.store, second.store]
    owned = [split_by_owner(worker.loop.engine.hasher.hashes(t), shards.shards()) for t in turns]
    chains_on = [sum(1 for groups in owned if shard in groups) for shard in shards.shards()]  # turns with blocks there
    assert all(chains_on) and all(s.held_hashes() for s in stores)
    assert [(s.counters.lookup_calls, s.counters.lookups, s.counters.puts) for s in stores] == [(1, n, 1) for n in chains_on]
    assert [s.active_leases for s in stores] == [0, 0]
