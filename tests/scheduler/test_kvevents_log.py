"""The publisher-side core of the KV events contract (kvmesh.runtime.kvevents)."""

from kvmesh.runtime.kvevents import KvEventLog, removed, stored


def make(ring_size: int = 2) -> KvEventLog:
    held = {b"a", b"b"}
    return KvEventLog("w1", lambda: sorted(held), ring_size=ring_size, clock=lambda: 5.0)


def test_batches_are_numbered_from_one():
    log = make()
    first = log.append([stored([b"a"])])
    second = log.append([removed([b"a"])])
    assert (first.seq, second.seq, second.worker_id, second.timestamp) == (1, 2, "w1", 5.0)
    assert first.events[0].stored.parent_hash == b""


def test_a_replay_within_the_ring_returns_the_missing_batches():
    log = make(ring_size=2)
    for h in (b"a", b"b", b"c"):
        log.append([stored([h])])
    reply = log.replay(2)
    assert ([b.seq for b in reply.batches], reply.full_dump, reply.seq) == ([2, 3], False, 3)


def test_a_replay_older_than_the_ring_is_a_full_dump():
    log = make(ring_size=2)
    for h in (b"a", b"b", b"c"):
        log.append([stored([h])])
    reply = log.replay(1)
    assert (reply.full_dump, list(reply.held), reply.seq, len(reply.batches)) == (True, [b"a", b"b"], 3, 0)


def test_a_replay_from_the_future_returns_nothing():
    log = make()
    log.append([stored([b"a"])])
    reply = log.replay(5)
    assert (len(reply.batches), reply.full_dump, reply.seq) == (0, False, 1)
