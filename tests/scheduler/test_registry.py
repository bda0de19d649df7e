from kvmesh.scheduler.registry import Registry, Role, Seen

from .helpers import FakeClock, hb


def make() -> tuple[Registry, FakeClock]:
    clock = FakeClock()
    return Registry(heartbeat_timeout_s=3.0, clock=clock), clock


def test_a_worker_appears_on_its_first_heartbeat():
    registry, _ = make()
    assert registry.observe(hb("d1")) is Seen.NEW
    assert [w.worker_id for w in registry.live(Role.DECODE)] == ["d1"]


def test_a_silent_worker_is_dropped_after_the_timeout_and_not_before():
    registry, clock = make()
    registry.observe(hb("d1"))
    registry.observe(hb("d2"))
    clock.advance(2.0)
    registry.observe(hb("d2"))
    clock.advance(1.5)  # d1 silent 3.5 s, d2 1.5 s
    assert registry.expire() == ["d1"]
    assert [w.worker_id for w in registry.all()] == ["d2"]


def test_a_restarted_worker_resets_its_state_and_orphans_its_requests():
    registry, _ = make()
    registry.observe(hb("d1", started_at=1.0))
    registry.assign("r1", "d1", None, prefill_s=0.5)
    assert registry.get("d1").inflight == 1
    assert registry.observe(hb("d1", started_at=2.0)) is Seen.RESTARTED
    assert registry.get("d1").inflight == 0
    assert registry.get("d1").backlog(registry.clock()) == 0.0
    assert [a.request_id for a in registry.drain_orphaned()] == ["r1"]
    assert registry.drain_orphaned() == []


def test_draining_workers_take_no_new_requests():
    registry, _ = make()
    registry.observe(hb("d1", draining=True))
    registry.observe(hb("d2"))
    assert [w.worker_id for w in registry.live(Role.DECODE)] == ["d2"]
    assert len(registry.all()) == 2


def test_live_filters_by_role_pool_and_exclusions():
    registry, _ = make()
    registry.observe(hb("d1"))
    registry.observe(hb("d2", pool="canary"))
    registry.observe(hb("p1", role=Role.PREFILL))
    assert [w.worker_id for w in registry.live(Role.DECODE, "production")] == ["d1"]
    assert [w.worker_id for w in registry.live(Role.DECODE, None, exclude=["d1"])] == ["d2"]
    assert [w.worker_id for w in registry.live(Role.PREFILL)] == ["p1"]


def test_load_counts_in_flight_requests_until_complete():
    registry, _ = make()
    registry.observe(hb("d1", num_running=1))
    registry.assign("r1", "d1", None, 0.0)
    registry.assign("r2", "d1", None, 0.0)
    assert registry.get("d1").load == 3  # reported 1 + 2 routed since that heartbeat
    registry.observe(hb("d1", num_running=2))
    assert registry.get("d1").load == 2
    registry.complete("r1")
    assert registry.get("d1").inflight == 1
    assert registry.get("d1").load == 1  # completed since the heartbeat: no longer counted
    assert registry.complete("r1") is None  # idempotent


def test_a_quick_sequence_does_not_pile_up_load_between_heartbeats():
    registry, _ = make()
    registry.observe(hb("d1"))
    for i in range(5):
        registry.assign(f"r{i}", "d1", None, 0.0)
        registry.complete(f"r{i}")
    assert registry.get("d1").load == 0


def test_prefill_backlog_drains_with_time():
    registry, clock = make()
    registry.observe(hb("d1"))
    registry.observe(hb("p1", role=Role.PREFILL))
    registry.assign("r1", "d1", "p1", prefill_s=2.0)
    clock.advance(0.5)
    assert registry.get("p1").backlog(clock()) == 1.5
    assert registry.get("d1").backlog(clock()) == 0.0
    clock.advance(5.0)
    assert registry.get("p1").backlog(clock()) == 0.0


def test_grace_after_our_own_outage_keeps_silent_workers():
    registry, clock = make()
    registry.observe(hb("d1"))
    clock.advance(registry.heartbeat_timeout_s + 1)
    registry.grace()
    assert registry.expire() == []
    clock.advance(registry.heartbeat_timeout_s + 1)
    assert registry.expire() == ["d1"]


def test_requests_a_decode_worker_no_longer_holds_are_reclaimed_from_its_heartbeat():
    """A lost Complete must not hold the worker's load and admission slot forever."""
    registry, clock = make()
    registry.observe(hb("d1"))
    registry.assign("lost", "d1", None, prefill_s=0.0)
    registry.assign("running", "d1", None, prefill_s=0.0)
    clock.advance(6.0)
    registry.assign("just-routed", "d1", None, prefill_s=0.0)  # not at the worker yet: spared
    registry.observe(hb("d1", live_request_ids=frozenset({"running"})))
    assert [a.request_id for a in registry.drain_orphaned()] == ["lost"]
    assert registry.open_assignments() == 2 and registry.get("d1").inflight == 2
    assert registry.complete("lost") is None


def test_a_worker_that_does_not_report_its_requests_keeps_them():
    registry, clock = make()
    registry.observe(hb("d1"))
    registry.assign("r1", "d1", None, prefill_s=0.0)
    clock.advance(60.0)
    registry.observe(hb("d1"))  # live_request_ids unset: an older or foreign worker
    assert registry.open_assignments() == 1 and registry.drain_orphaned() == []


def test_the_heartbeat_message_says_whether_it_lists_live_requests():
    from kvmesh.runtime.pb import events_pb2
    from kvmesh.scheduler.events import heartbeat_from_pb

    listing = events_pb2.Heartbeat(worker_id="d1", role=2, live_requests=events_pb2.LiveRequests(request_ids=["a", "b"]))
    empty = events_pb2.Heartbeat(worker_id="d1", role=2, live_requests=events_pb2.LiveRequests())
    assert heartbeat_from_pb(listing).live_request_ids == {"a", "b"}
    assert heartbeat_from_pb(empty).live_request_ids == frozenset()
    assert heartbeat_from_pb(events_pb2.Heartbeat(worker_id="d1", role=2)).live_request_ids is None


def test_a_worker_whose_engine_stops_progressing_with_work_gets_no_new_requests():
    """Issue 16 item 3: heartbeats carry engine_progress; unchanged for stall_s while the worker
    has work = stalled, not routable; progress (or having nothing to do) makes it routable again."""
    clock = FakeClock()
    registry = Registry(heartbeat_timeout_s=30.0, clock=clock, stall_s=5.0)
    registry.observe(hb("d1", num_running=2, engine_progress=7))
    registry.observe(hb("d2", num_running=2))  # reports no progress: judged by its heartbeats alone
    for _ in range(6):
        clock.advance(1.0)
        registry.observe(hb("d1", num_running=2, engine_progress=7))
        registry.observe(hb("d2", num_running=2))
    assert [w.worker_id for w in registry.live(Role.DECODE)] == ["d2"]
    registry.observe(hb("d1", num_running=2, engine_progress=8))
    assert [w.worker_id for w in registry.live(Role.DECODE)] == ["d1", "d2"]
    clock.advance(6.0)
    registry.observe(hb("d1", engine_progress=8))  # idle: nothing pending is no stall
    registry.observe(hb("d2", num_running=2))
    assert [w.worker_id for w in registry.live(Role.DECODE)] == ["d1", "d2"]
