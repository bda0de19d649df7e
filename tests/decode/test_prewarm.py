"""Pre-warming a decode worker: a real KV store holds a turn another worker handed back; the new
worker, asked over real NATS, fetches the prefix into its cache and serves it from there."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from kvmesh.decode.main import start
from kvmesh.decode.prewarm import Prewarm
from kvmesh.kvstore.config import KvStoreSettings
from kvmesh.kvstore.main import start as start_store
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.runtime import kvwire
from kvmesh.runtime.bus import KV_PREWARM_SUBJECT, Bus
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvshards import ShardDirectory
from kvmesh.runtime.pb import decode_pb2_grpc, events_pb2
from kvmesh.worker.storereader import StoreReader

from .helpers import BLOCK_SIZE, PROMPT, collect, decode_settings, generate_request, greedy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def store_with_a_turn():
    """A KV store holding PROMPT's blocks, put there by a decode worker's hand-back."""
    store = await start_store(KvStoreSettings(host="127.0.0.1", port=0, metrics_port=-1, nats=False, block_size=BLOCK_SIZE,
                                              store_id="kvstore-test"), StoreMetrics(CollectorRegistry()))
    first = await start(decode_settings(kvstore=store.endpoint))
    try:
        async with grpc.aio.insecure_channel(first.endpoint) as channel:
            await collect(decode_pb2_grpc.DecodeWorkerStub(channel), generate_request(max_tokens=4))
        for _ in range(200):
            if first.worker.handback.blocks_stored:
                break
            await asyncio.sleep(0.02)
    finally:
        await first.stop()
    yield store
    await store.stop()


def request_for(hashes: list[bytes]) -> events_pb2.PrewarmRequest:
    return events_pb2.PrewarmRequest(prefixes=[events_pb2.PrewarmPrefix(block_hashes=hashes)], num_blocks=len(hashes))


async def test_a_joining_worker_fetches_the_prefix_over_nats_and_serves_it_from_cache(
    store_with_a_turn, nats_server, reference
):
    worker_bus = await Bus.connect(nats_server.url, "decode-d-new")
    new = await start(decode_settings(kvstore=store_with_a_turn.endpoint, worker_id="d-new"), worker_bus)
    bus = await Bus.connect(nats_server.url, "test-scheduler")
    try:
        hashes = new.loop.engine.hasher.hashes(PROMPT)  # 3 full blocks
        assert await new.loop.call("cached_prefix_blocks", PROMPT) == 0
        reply = await bus.request(KV_PREWARM_SUBJECT.format(worker_id="d-new"), request_for(hashes),
                                  events_pb2.PrewarmReply, timeout_s=30)
        assert (reply.blocks_requested, reply.blocks_fetched, reply.blocks_cached, reply.error) == (3, 3, 3, "")
        assert reply.seconds > 0
        assert await new.loop.call("cached_prefix_blocks", PROMPT) == 3
        hit_before = new.loop.stats.prefix_hit_tokens
        async with grpc.aio.insecure_channel(new.endpoint) as channel:
            tokens, _ = await collect(decode_pb2_grpc.DecodeWorkerStub(channel), generate_request(max_tokens=6))
        assert tokens == greedy(reference, PROMPT, 6)  # the store's KV is the KV this prompt computes
        assert new.loop.stats.prefix_hit_tokens - hit_before == 3 * BLOCK_SIZE
    finally:
        await bus.close()
        await new.stop()
        await worker_bus.close()


async def test_what_the_store_lacks_is_skipped_and_without_a_store_nothing_is_fetched(store_with_a_turn):
    new = await start(decode_settings())
    try:
        spec = kvwire.model_spec(new.loop.engine.hasher.model_id, new.loop.engine.model_args,
                                 new.loop.engine.hasher.dtype, BLOCK_SIZE)
        hashes = new.loop.engine.hasher.hashes(PROMPT)
        other = new.loop.engine.hasher.hashes([7] * 8)  # never stored
        shards = ShardDirectory.from_setting(store_with_a_turn.endpoint)
        warm = Prewarm(new.loop, StoreReader(ShardedStore(shards, new.channels, spec, 10.0), spec))
        both = events_pb2.PrewarmRequest(prefixes=[events_pb2.PrewarmPrefix(block_hashes=other),
                                                   events_pb2.PrewarmPrefix(block_hashes=hashes[:2]),
                                                   events_pb2.PrewarmPrefix(block_hashes=hashes)])
        reply = await warm.warm(both)
        # The second prefix's two blocks are not fetched again for the third.
        assert (reply.blocks_requested, reply.blocks_fetched, reply.blocks_cached, reply.error) == (5, 3, 3, "")
        no_store = await Prewarm(new.loop, None).warm(request_for(hashes))
        assert (no_store.blocks_fetched, no_store.error) == (0, "this worker has no KV store to fetch from")
    finally:
        await new.stop()
