"""The mirror buffer: bounded by records and bytes, deduplicated, never blocking."""

import pytest

from kvmesh.canary.buffer import Admission, MirrorBuffer


def test_accepts_in_order_and_pops_fifo():
    buf = MirrorBuffer(max_bytes=1000, max_records=10)
    assert buf.offer("a", b"ka", 100, "A") is Admission.ACCEPTED
    assert buf.offer("b", b"kb", 200, "B") is Admission.ACCEPTED
    assert buf.bytes_used == 300
    assert [buf.pop().item, buf.pop().item, buf.pop()] == ["A", "B", None]
    assert buf.bytes_used == 0


def test_same_request_id_is_a_duplicate():
    buf = MirrorBuffer(max_bytes=1000, max_records=10)
    buf.offer("a", b"k1", 10, "first")
    assert buf.offer("a", b"k2", 10, "again") is Admission.DUPLICATE
    assert (buf.counts().accepted, buf.counts().duplicates, len(buf)) == (1, 1, 1)


def test_same_content_key_is_a_duplicate():
    buf = MirrorBuffer(max_bytes=1000, max_records=10)
    buf.offer("a", b"same", 10, "first")
    assert buf.offer("b", b"same", 10, "other id, same prompt") is Admission.DUPLICATE


def test_duplicates_are_remembered_after_replay():
    buf = MirrorBuffer(max_bytes=1000, max_records=10)
    buf.offer("a", b"ka", 10, "A")
    buf.pop()
    assert buf.offer("a", b"ka", 10, "A") is Admission.DUPLICATE


def test_dedup_window_forgets_oldest_keys():
    buf = MirrorBuffer(max_bytes=10_000, max_records=2, dedup_window=2)
    for rid in ("a", "b", "c"):
        buf.offer(rid, rid.encode(), 1, rid)
        buf.pop()
    assert buf.offer("a", b"a", 1, "a") is Admission.ACCEPTED
    assert buf.offer("c", b"c", 1, "c") is Admission.DUPLICATE


def test_drops_when_record_count_is_reached():
    buf = MirrorBuffer(max_bytes=1000, max_records=2)
    buf.offer("a", b"a", 1, "A")
    buf.offer("b", b"b", 1, "B")
    assert buf.offer("c", b"c", 1, "C") is Admission.FULL
    counts = buf.counts()
    assert (counts.accepted, counts.dropped, counts.buffered) == (2, 1, 2)


def test_drops_when_byte_budget_is_exceeded():
    buf = MirrorBuffer(max_bytes=250, max_records=10)
    buf.offer("a", b"a", 200, "A")
    assert buf.offer("b", b"b", 51, "B") is Admission.FULL
    assert buf.offer("c", b"c", 50, "C") is Admission.ACCEPTED
    assert (buf.counts().dropped, buf.counts().buffered_bytes) == (1, 250)


def test_a_dropped_record_may_come_back_when_there_is_room():
    buf = MirrorBuffer(max_bytes=1000, max_records=1)
    buf.offer("a", b"a", 1, "A")
    assert buf.offer("b", b"b", 1, "B") is Admission.FULL
    buf.pop()
    assert buf.offer("b", b"b", 1, "B") is Admission.ACCEPTED


def test_rejects_nonsense_limits():
    with pytest.raises(ValueError):
        MirrorBuffer(max_bytes=0, max_records=1)
