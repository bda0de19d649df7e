"""Two scheduler replicas in-process on one real nats-server: shares, shared predictions, catch-up."""

import asyncio

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.kvevents import KvEventPublisher, stored
from kvmesh.runtime.pb import scheduler_pb2

from .helpers import hashes
from .test_service import DEADLINE_S, _async, _has, eventually, heartbeats, route_request, scheduler

COLD = hashes("cold prompt", 4)
WARM = hashes("warm prompt", 4)


def session_request(request_id: str, blocks, session_id: str) -> scheduler_pb2.RouteRequest:
    request = route_request(request_id, blocks)
    request.session_id = session_id
    return request


async def test_replicas_split_admission_share_predictions_and_a_late_one_catches_up(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    held: list[bytes] = []
    publisher = await KvEventPublisher.start(bus, "d2", lambda: list(held), ring_size=1)
    settings = dict(replica_timeout_s=1.0, replica_heartbeat_s=0.1, prediction_ttl_s=30.0)
    # NOTE: heartbeats every 0.4 s here, so a late replica that lists both workers as soon as it
    # serves has waited for them (sync.py), not been lucky with the period.
    async with (heartbeats(bus, "d1", max_num_seqs=5, interval_s=0.4),
                heartbeats(bus, "d2", max_num_seqs=4, seq=lambda: publisher.seq, interval_s=0.4)):
        held.extend(WARM)
        await publisher.publish([stored(WARM)])
        async with scheduler(nats_server.url, replica_id="a", **settings) as (a, stub_a):
            async with scheduler(nats_server.url, replica_id="b", **settings) as (b, stub_b):
                await eventually(lambda: _has(stub_a, "d1", "d2"))
                await eventually(lambda: _has(stub_b, "d1", "d2"))
                await eventually(lambda: _async(a.gate.queue.slots == 5 and b.gate.queue.slots == 4))
                # a routes a cold prompt: b counts it on the same worker, its blocks as predicted there
                first = await stub_a.Route(session_request("r1", COLD, "s1"), timeout=DEADLINE_S)
                chosen = first.decode.worker_id
                await eventually(lambda: _async(b.peers.predictions_received == 1))
                now = b.router.registry.clock()
                assert b.router.index.overlap([chosen], COLD, now)[chosen] == 4
                assert b.router.index.overlap([chosen], COLD)[chosen] == 0  # predicted, not confirmed
                # the session's next turn reaches b, which has no sticky entry for it: the shared
                # prediction sends it to the same worker (sticky tables are per replica, docs/replicas.md).
                # NOTE: as a next turn would, after the first turn's prefill: while b still counts that
                # prefill queued on the worker (~3 ms here), its cost can tip the choice to the other one
                await eventually(lambda: _async(b.router.registry.get(chosen).backlog(b.router.registry.clock()) == 0.0))
                second = await stub_b.Route(session_request("r2", COLD, "s1"), timeout=DEADLINE_S)
                assert second.decode.worker_id == chosen
                for stub, rid in ((stub_a, "r1"), (stub_b, "r2")):
                    await stub.Complete(scheduler_pb2.CompleteRequest(request_id=rid, status="ok"), timeout=DEADLINE_S)
                # a stepwise promote made on one replica reaches the other
                split = scheduler_pb2.SetProductionPoolRequest(pool="production", canary_pool="candidate", canary_weight=0.25)
                await stub_b.SetProductionPool(split, timeout=DEADLINE_S)
                await eventually(lambda: _async(a.router.registry.split.canary_weight == 0.25), timeout_s=2.0)
            # b is gone: a admits the whole limit again
            await eventually(lambda: _async(a.gate.queue.slots == 9), timeout_s=3.0)
            # a late replica syncs before it serves: it hears every worker its peer lists and learns
            # what d2 held before it started from a (chunked) full dump, then follows the live events
            held.extend(COLD[:1])
            await publisher.publish([stored(COLD[:1])])  # seq 2: the ring (size 1) no longer has seq 1
            async with scheduler(nats_server.url, replica_id="c", **settings) as (c, stub_c):
                assert c.synced.peer and not c.synced.timed_out, c.synced
                assert await _has(stub_c, "d1", "d2")  # at once: no waiting for a heartbeat period
                assert c.router.index.overlap(["d2"], WARM)["d2"] == 4 and c.router.index.stats.full_dumps == 1
                held.extend(COLD[1:2])
                await publisher.publish([stored(COLD[1:2])])  # seq 3, applied live after the dump
                await eventually(lambda: _async(c.router.index.overlap(["d2"], COLD)["d2"] == 2), timeout_s=5.0)
                reply_a = await stub_a.Route(route_request("r3", WARM), timeout=DEADLINE_S)
                reply_c = await stub_c.Route(route_request("r4", WARM), timeout=DEADLINE_S)
                assert reply_a.decode.worker_id == reply_c.decode.worker_id == "d2"
                assert reply_c.decode_cached_blocks == 4
                assert c.router.registry.split.canary == "candidate"  # a late replica learns the split too
    await publisher.close()
    await bus.close()
    await asyncio.sleep(0)
