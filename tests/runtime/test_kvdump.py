"""The KV event full dump in chunks: pure chunking, and a 1M-block dump through a real nats-server."""

import asyncio
import hashlib

import pytest

from kvmesh.runtime.bus import KV_REPLAY_SUBJECT, Bus, NoRespondersError
from kvmesh.runtime.kvevents import DUMP_CHUNK, KvEventLog, KvEventPublisher, fetch_dump, stored
from kvmesh.runtime.pb import events_pb2
from kvmesh.scheduler.events import replay_from_pb
from kvmesh.scheduler.index import BlockIndex, EventBatch, Stored


def held_hashes(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(n)]


def test_a_dump_past_the_ring_comes_in_chunks_that_join_to_the_held_set():
    held = held_hashes(10)
    log = KvEventLog("w", lambda: held, ring_size=1, dump_chunk=4)
    log.append([stored(held)])
    log.append([stored(held[:1])])
    first = log.replay(1)
    assert (first.full_dump, first.num_chunks, first.chunk, list(first.held), first.seq) == (True, 3, 0, held[:4], 2)
    replies = {c: log.dump_chunk(first.dump_id, c) for c in (1, 2)}
    assert [list(replies[c].held) for c in (1, 2)] == [held[4:8], held[8:]]

    async def request(message):
        return log.dump_chunk(message.dump_id, message.chunk)

    whole = asyncio.run(fetch_dump(first, request))
    assert list(whole.held) == held and whole.seq == 2


def test_a_dump_is_a_snapshot_and_a_forgotten_one_is_refused():
    held = held_hashes(6)
    log = KvEventLog("w", lambda: list(held), ring_size=1, dump_chunk=4)
    log.append([stored(held)])
    log.append([stored(held[:1])])
    first = log.replay(1)
    held.clear()  # changes after the dump do not leak into its later chunks
    assert list(log.dump_chunk(first.dump_id, 1).held) == held_hashes(6)[4:]
    for _ in range(5):
        log.replay(1)  # older dumps are dropped after DUMPS_KEPT newer ones
    assert log.dump_chunk(first.dump_id, 1).seq == 0

    async def request(message):
        return log.dump_chunk(message.dump_id, message.chunk)

    with pytest.raises(ValueError, match="is gone"):
        asyncio.run(fetch_dump(first, request))


async def first_reply(request, message, attempts: int = 5):
    """The first request, asked again as the scheduler's feed does when nobody answers.

    NOTE: on a loaded host both test connections have been seen to drop and reconnect at once
    (the captured log says so); a request sent before the publisher's subscription is back
    gets no responders. The feed retries the same way (REPLAY_ATTEMPTS)."""
    for attempt in range(attempts):
        try:
            return await request(message)
        except NoRespondersError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)


async def test_a_million_block_dump_round_trips_over_nats_into_the_index(nats_server):
    n = 1_000_000
    held = held_hashes(n)
    publisher_bus = await Bus.connect(nats_server.url, "worker")
    subscriber_bus = await Bus.connect(nats_server.url, "scheduler")
    publisher = await KvEventPublisher.start(publisher_bus, "w", lambda: held, ring_size=1)
    try:
        await publisher_bus.client.flush()
        await publisher.publish([stored(held[:1])])
        await publisher.publish([stored(held[1:2])])
        subject = KV_REPLAY_SUBJECT.format(worker_id="w")

        async def request(message):
            return await subscriber_bus.request(subject, message, events_pb2.KvReplayReply, 10.0)

        first = await first_reply(request, events_pb2.KvReplayRequest(from_seq=1))
        assert first.num_chunks == -(-n // DUMP_CHUNK) and len(first.SerializeToString()) < 1 << 20
        whole = await fetch_dump(first, request)
        assert whole.held == held and whole.seq == 2
        index = BlockIndex()
        index.apply(EventBatch("w", 1, (Stored((held[0],)),)))
        assert index.apply(EventBatch("w", 3, (Stored((b"late",)),))) == 2  # a gap: repaired by the dump
        assert index.apply_replay("w", replay_from_pb(whole, "w")) is None
        assert index.num_entries == n + 1 and index.last_seq("w") == 3
    finally:
        await publisher.close()
        await publisher_bus.close()
        await subscriber_bus.close()
