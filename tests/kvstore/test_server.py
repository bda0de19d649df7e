"""The KvStore gRPC service in-process on 127.0.0.1:0: round trips, leases, bad input, restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import pytest
from prometheus_client import CollectorRegistry

from kvmesh.kvstore import codec
from kvmesh.kvstore.blocks import Encoding, check_block
from kvmesh.kvstore.config import KvStoreSettings
from kvmesh.kvstore.disk import DiskDir
from kvmesh.kvstore.main import start
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.kvstore.server import block_frame, block_from_pb, block_to_pb
from kvmesh.runtime.grpcutil import CHANNEL_OPTIONS
from kvmesh.runtime.pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc

from .conftest import BLOCK_BYTES, SPEC, block, chain, h

SPEC_PB = common_pb2.ModelSpec(**{f.name: getattr(SPEC, f.name) for f in dataclasses.fields(SPEC)})
TIMEOUT = 10


def settings(**overrides) -> KvStoreSettings:
    base = dict(host="127.0.0.1", port=0, metrics_port=-1, nats=False, block_size=SPEC.block_size,
                memory_bytes=8 * BLOCK_BYTES, store_id="kvstore-test", tick_s=0.05)
    return KvStoreSettings(**(base | overrides))


@pytest.fixture
async def running_factory():
    started = []

    async def make(**overrides):
        running = await start(settings(**overrides), StoreMetrics(CollectorRegistry()))
        channel = grpc.aio.insecure_channel(running.endpoint, options=CHANNEL_OPTIONS)
        started.append((running, channel))
        return running, kvstore_pb2_grpc.KvStoreStub(channel)

    yield make
    for running, channel in started:
        await channel.close()
        await running.stop()


@pytest.fixture
async def stub(running_factory):
    return (await running_factory())[1]


def put_messages(blocks, parent=b"", commit=None):
    yield kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(spec=SPEC_PB, producer_id="t", parent_hash=parent))
    for b in blocks:
        yield kvstore_pb2.PutMessage(block=b if isinstance(b, common_pb2.KvBlock) else block_to_pb(b))
    count = len(blocks) if commit is None else commit
    if count >= 0:
        yield kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=count))


async def put(stub, blocks, **kwargs):
    return await stub.Put(put_messages(blocks, **kwargs), timeout=TIMEOUT)


async def get(stub, names, encoding=common_pb2.KV_ENCODING_RAW):
    request = kvstore_pb2.GetRequest(spec=SPEC_PB, block_hashes=[h(n) for n in names], encoding=encoding)
    return [b async for b in stub.Get(request, timeout=TIMEOUT)]


async def lookup(stub, names):
    return await stub.Lookup(kvstore_pb2.LookupRequest(spec=SPEC_PB, block_hashes=[h(n) for n in names]), timeout=TIMEOUT)


async def test_put_lookup_get_round_trip_is_byte_exact(stub):
    reply = await put(stub, chain("a1", "a2", "a3"))
    assert (reply.stored, reply.duplicates) == (3, 0)

    found = await lookup(stub, ["a1", "a2", "x"])
    assert found.num_blocks == 2 and found.lease_id and found.lease_expires_in_s == 30

    got = await get(stub, ["a1", "a2", "a3"])
    assert [block_from_pb(b) for b in got] == chain("a1", "a2", "a3")

    again = await put(stub, chain("a1", "a2", "a3", "b1"))
    assert (again.stored, again.duplicates) == (1, 3)
    stats = await stub.Stats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert stats.tiers[0].blocks == 4 and stats.puts == 2 and stats.lookup_hit_blocks == 2


@pytest.mark.parametrize("encoding", [Encoding.RAW, Encoding.INT8, Encoding.INT4])
def test_a_blocks_frame_is_its_message_serialized(encoding):
    """Get answers with `block_frame`s, serialized on the store thread; gRPC passes them through."""
    b = codec.convert(block("a1"), encoding)
    assert block_frame(b) == block_to_pb(b).SerializeToString()
    assert block_from_pb(common_pb2.KvBlock.FromString(block_frame(b))) == b


async def test_get_can_serve_int8(stub):
    await put(stub, [block("a1")])
    (got,) = await get(stub, ["a1"], common_pb2.KV_ENCODING_INT8)
    int8 = block_from_pb(got)
    assert int8.header.encoding is Encoding.INT8
    check_block(SPEC, int8)
    assert int8 == codec.convert(block("a1"), Encoding.INT8)


async def test_a_leased_block_is_not_evicted(running_factory):
    _, stub = await running_factory(memory_bytes=2 * BLOCK_BYTES)
    await put(stub, [block("a1")])
    assert (await lookup(stub, ["a1"])).num_blocks == 1
    await put(stub, [block("b1")])
    await put(stub, [block("c1")])
    assert (await lookup(stub, ["a1"])).num_blocks == 1
    assert (await lookup(stub, ["b1"])).num_blocks == 0


async def test_an_unknown_hash_is_not_found(stub):
    await put(stub, [block("a1")])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await get(stub, ["a1", "x"])
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert h("x").hex()[:16] in err.value.details()


def corrupt(b, **header):
    pb = block_to_pb(b)
    for name, value in header.items():
        if name == "data":
            pb.data = value
        elif name == "shape":
            del pb.header.shape[:]
            pb.header.shape.extend(value)
        else:
            setattr(pb.header, name, value)
    return pb


@pytest.mark.parametrize("bad, message", [
    (corrupt(block("a2", 1), data=bytes(BLOCK_BYTES)), "checksum"),
    (corrupt(block("a2", 1), dtype="bfloat16"), "dtype"),
    (corrupt(block("a2", 1), shape=[2, 2, 4, 4, 2]), "shape"),
    (corrupt(block("a2", 1), encoding=7), "unknown KV encoding"),
    (corrupt(block("a2", 1), block_hash=b""), "block_hash"),
    (corrupt(block("a2", 1), byte_length=10), "byte_length"),
])
async def test_a_bad_frame_is_invalid_and_nothing_is_stored(stub, bad, message):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await put(stub, [block("a1"), bad])
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert (await lookup(stub, ["a1"])).num_blocks == 0


@pytest.mark.parametrize("messages, message", [
    ([kvstore_pb2.PutMessage(block=block_to_pb(block("a1")))], "must start with an `open`"),
    (list(put_messages([block("a1")], commit=-1)), "without a commit"),
    (list(put_messages([block("a1")], commit=2)), "commit says 2"),
    (list(put_messages([block("a1")], parent=b"short")), "parent_hash"),
])
async def test_a_malformed_put_stream_is_invalid(stub, messages, message):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(iter(messages), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert (await lookup(stub, ["a1"])).num_blocks == 0


async def test_too_many_blocks_or_a_wrong_block_size_is_invalid(running_factory):
    _, stub = await running_factory(max_blocks_per_put=2)
    for blocks, spec in ((chain("a1", "a2", "a3"), SPEC_PB), ([block("a1")], common_pb2.ModelSpec(
            model_id="m", dtype="float32", block_size=16, num_layers=2, num_kv_heads=2, head_dim=4))):
        messages = list(put_messages(blocks))
        messages[0].open.spec.CopyFrom(spec)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Put(iter(messages), timeout=TIMEOUT)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_restart_with_disk_rebuilds_and_drops_a_corrupted_file(running_factory, tmp_path):
    disk = dict(disk_bytes=100_000, disk_dir=str(tmp_path))
    running, stub = await running_factory(**disk)
    await put(stub, chain("a1", "a2", "a3"))
    await running.stop()  # persists the memory tier to disk
    path = DiskDir(tmp_path).path((SPEC.namespace, h("a3")))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))

    running, stub = await running_factory(**disk)

    assert (await lookup(stub, ["a1", "a2", "a3"])).num_blocks == 2
    assert [block_from_pb(b) for b in await get(stub, ["a1", "a2"])] == chain("a1", "a2")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await get(stub, ["a3"])
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert not path.exists()
    stats = await stub.Stats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert [(t.name, t.blocks, t.evictions) for t in stats.tiers] == [("memory", 0, 0), ("disk", 2, 1)]


async def test_metrics_carry_the_documented_names(running_factory):
    registry = CollectorRegistry()
    running = await start(settings(), StoreMetrics(registry))
    try:
        channel = grpc.aio.insecure_channel(running.endpoint, options=CHANNEL_OPTIONS)
        stub = kvstore_pb2_grpc.KvStoreStub(channel)
        await put(stub, [block("a1")])
        await lookup(stub, ["a1", "x"])
        await get(stub, ["a1"])
        with pytest.raises(grpc.aio.AioRpcError):
            await put(stub, [corrupt(block("a2"), checksum=1)])
        await channel.close()
    finally:
        await running.stop()
    value = registry.get_sample_value
    assert value("kvmesh_kvstore_blocks", {"tier": "memory"}) == 1
    assert value("kvmesh_kvstore_bytes", {"tier": "memory"}) == BLOCK_BYTES
    assert value("kvmesh_kvstore_capacity_bytes", {"tier": "disk"}) == 0
    assert value("kvmesh_kvstore_lookup_query_blocks_total") == 2
    assert value("kvmesh_kvstore_lookup_hit_blocks_total") == 1
    assert value("kvmesh_kvstore_get_bytes_total") == BLOCK_BYTES
    assert value("kvmesh_kvstore_put_bytes_total") == BLOCK_BYTES
    assert value("kvmesh_kvstore_rejected_total", {"reason": "invalid"}) == 1


async def test_an_abandoned_put_is_reclaimed_and_its_stream_refused(running_factory):
    running, stub = await running_factory(put_timeout_s=0.2)
    reclaimed = asyncio.Event()

    async def stalled():
        yield next(put_messages([]))
        await reclaimed.wait()
        yield kvstore_pb2.PutMessage(block=block_to_pb(block("a1")))

    call = stub.Put(stalled(), timeout=TIMEOUT)
    for _ in range(500):
        if running.store.abandoned_puts:
            break
        await asyncio.sleep(0.01)
    assert running.store.abandoned_puts == 1 and running.store.open_puts == 0  # reclaimed by the periodic tick
    reclaimed.set()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert (await lookup(stub, ["a1"])).num_blocks == 0


async def test_the_event_loop_keeps_serving_while_the_store_reads_and_writes(running_factory):
    """Disk reads, checksums and (de)quantization run on the store's own thread: a slow read or
    write must not stall the event loop (before, every other RPC waited behind it)."""
    running, stub = await running_factory()
    store = running.servicer.store
    ticks = 0
    seen: list[int] = []

    def slow(fn):
        def wrapper(*args, **kwargs):
            start = ticks
            time.sleep(0.3)  # a disk tier under load
            seen.append(ticks - start)
            return fn(*args, **kwargs)
        return wrapper

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        store.stage = slow(store.stage)
        await put(stub, chain("s1"))
        store.read = slow(store.read)
        assert [block_from_pb(b) for b in await get(stub, ["s1"])] == chain("s1")
    finally:
        task.cancel()
    assert len(seen) == 2 and min(seen) >= 1, f"loop ticks during the slow store calls: {seen}"
