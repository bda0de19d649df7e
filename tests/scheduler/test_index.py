from kvmesh.scheduler.index import BlockIndex, Cleared, EventBatch, Removed, Replay

from .helpers import hashes, stored_batch

A = hashes("a", 4)


def test_overlap_is_the_longest_contiguous_prefix_per_worker():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A))
    index.apply(stored_batch("w2", 1, A[:2]))
    index.apply(stored_batch("w3", 1, A[1:]))  # holds blocks but not the first: no prefix
    assert index.overlap(["w1", "w2", "w3", "w4"], A) == {"w1": 4, "w2": 2, "w3": 0, "w4": 0}


def test_removed_and_cleared_events_shrink_the_prefix():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A))
    index.apply(EventBatch("w1", 2, (Removed((A[2],)),)))
    assert index.overlap(["w1"], A) == {"w1": 2}
    index.apply(EventBatch("w1", 3, (Cleared(),)))
    assert index.overlap(["w1"], A) == {"w1": 0}
    assert index.num_entries == 0
    assert index.stats.batches_applied == 3


def test_a_gap_asks_for_a_replay_and_buffers_until_it_is_repaired():
    index = BlockIndex()
    assert index.apply(stored_batch("w1", 1, A[:1])) is None
    assert index.apply(stored_batch("w1", 3, A[2:3])) == 2  # seq 2 lost
    assert index.stats.gaps == 1
    assert index.apply(stored_batch("w1", 4, A[3:])) is None  # buffered meanwhile
    assert index.overlap(["w1"], A) == {"w1": 1}
    assert index.apply_replay("w1", Replay(batches=(stored_batch("w1", 2, A[1:2]),), seq=4)) is None
    assert index.overlap(["w1"], A) == {"w1": 4}
    assert index.last_seq("w1") == 4


def test_a_full_dump_replaces_what_the_index_knew():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, hashes("old", 3)))
    assert index.apply(stored_batch("w1", 9, A[3:])) == 2
    assert index.apply_replay("w1", Replay(full_dump=True, held=A[:3], seq=8)) is None
    assert index.held("w1") == set(A)
    assert index.stats.full_dumps == 1


def test_missing_events_from_a_heartbeat_seq_are_detected_one_beat_later():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A[:1]))
    assert index.check_seq("w1", 2) is None  # the batch may still be in flight
    assert index.check_seq("w1", 2) == 2  # still behind a beat later: it was lost
    assert index.repairing("w1")


def test_a_worker_first_seen_with_events_behind_it_is_repaired_at_once():
    """A replica that just started (or a restarted worker) has none of its events: nothing in
    flight can fill the gap, so the first heartbeat's kv_event_seq asks for the replay."""
    index = BlockIndex()
    assert index.check_seq("w1", 0) is None  # nothing published yet: nothing to repair
    assert index.check_seq("w1", 7) == 1
    assert index.repairing("w1")


def test_a_failed_replay_forgets_the_worker_rather_than_keep_phantoms():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A[:2]))
    index.apply(stored_batch("w1", 5, A[2:3]))
    index.abandon_repair("w1")
    assert index.held("w1") == {A[2]}


def test_a_publisher_restart_at_seq_1_starts_over():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A[:2]))
    index.apply(stored_batch("w1", 2, A[2:3]))
    index.apply(stored_batch("w1", 1, A[3:]))
    assert index.held("w1") == {A[3]}


def test_dropping_a_worker_forgets_its_entries():
    index = BlockIndex()
    index.apply(stored_batch("w1", 1, A))
    index.apply(stored_batch("w2", 1, A))
    index.drop_worker("w1")
    assert index.overlap(["w1", "w2"], A) == {"w1": 0, "w2": 4}
    assert index.last_seq("w1") == 0


def test_predicted_entries_count_until_they_expire():
    index = BlockIndex()
    index.predict("w1", A, expires_at=10.0)
    assert index.overlap(["w1"], A, now=9.0) == {"w1": 4}
    assert index.overlap(["w1"], A) == {"w1": 0}  # without `now`, only confirmed entries
    assert index.overlap(["w1"], A, now=10.0) == {"w1": 0}
    index.prune_predictions(10.0)
    assert index.overlap(["w1"], A, now=5.0) == {"w1": 0}
