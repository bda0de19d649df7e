"""KV events and heartbeats on a real nats-server: AllCleared at start, BlockStored on commit,
BlockRemoved on eviction, replay on request, a KVSTORE heartbeat with the endpoint."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import CollectorRegistry

from kvmesh.kvstore.main import start
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.grpcutil import CHANNEL_OPTIONS
from kvmesh.runtime.pb import common_pb2, events_pb2, kvstore_pb2_grpc

from .conftest import BLOCK_BYTES, chain, h
from .test_server import put, settings


async def test_the_store_publishes_numbered_kv_events_and_heartbeats(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    batches: asyncio.Queue[events_pb2.KvEventBatch] = asyncio.Queue()
    beats: asyncio.Queue[events_pb2.Heartbeat] = asyncio.Queue()

    async def on_batch(batch, _msg):
        await batches.put(batch)

    async def on_beat(beat, _msg):
        await beats.put(beat)

    await bus.subscribe("kvmesh.kv.events.kvstore-test", events_pb2.KvEventBatch, on_batch)
    await bus.subscribe("kvmesh.workers.kvstore.kvstore-test.heartbeat", events_pb2.Heartbeat, on_beat)
    await bus.client.flush()
    running = await start(settings(nats=True, nats_url=nats_server.url, memory_bytes=2 * BLOCK_BYTES,
                                   heartbeat_interval_s=0.1), StoreMetrics(CollectorRegistry()))
    channel = grpc.aio.insecure_channel(running.endpoint, options=CHANNEL_OPTIONS)
    try:
        stub = kvstore_pb2_grpc.KvStoreStub(channel)
        await put(stub, chain("a1", "a2"), parent=h("p"))
        await put(stub, chain("b1"))

        got = [await asyncio.wait_for(batches.get(), 5) for _ in range(3)]
        assert [b.seq for b in got] == [1, 2, 3]
        assert got[0].events[0].WhichOneof("event") == "cleared"
        stored = got[1].events[0].stored
        assert list(stored.block_hashes) == [h("a1"), h("a2")] and stored.parent_hash == h("p")
        kinds = [e.WhichOneof("event") for e in got[2].events]
        assert kinds == ["stored", "removed"]
        assert list(got[2].events[1].removed.block_hashes) == [h("a2")]  # the suffix goes first

        reply = await bus.request("kvmesh.kv.replay.kvstore-test", events_pb2.KvReplayRequest(from_seq=2),
                                  events_pb2.KvReplayReply)
        assert [b.seq for b in reply.batches] == [2, 3] and reply.seq == 3

        beat = await asyncio.wait_for(beats.get(), 5)
        assert beat.role == common_pb2.WORKER_ROLE_KVSTORE and beat.endpoint == running.endpoint
    finally:
        await channel.close()
        await running.stop()
        await bus.close()
