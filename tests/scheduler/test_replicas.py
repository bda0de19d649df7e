"""Scheduler replicas: the live set and each replica's admission share."""

from kvmesh.scheduler.registry import Registry, Role
from kvmesh.scheduler.replicas import ReplicaSet

from .helpers import FakeClock, hb


def test_shares_of_the_mesh_wide_limit_sum_to_it_exactly():
    clock = FakeClock()
    views = {rid: ReplicaSet(rid, 2.0, clock) for rid in ("a", "b", "c")}
    for me, view in views.items():
        for other in views:
            view.observe(other, f"{other}:1", 1.0)
    assert [views[r].share(10) for r in "abc"] == [4, 3, 3]
    assert [views[r].share(2) for r in "abc"] == [1, 1, 0]
    assert all(view.count == 3 for view in views.values())


def test_a_silent_peer_is_gone_and_its_share_returns():
    clock = FakeClock()
    view = ReplicaSet("a", 2.0, clock)
    assert view.observe("b", "b:1", 1.0) is True
    assert view.observe("b", "b:1", 1.0) is False
    assert view.observe("b", "b:1", 2.0) is True  # restarted
    assert view.share(9) == 5
    clock.advance(2.5)
    assert view.expire() == ["b"]
    assert (view.count, view.share(9)) == (1, 9)
    assert view.observe("a", "a:1", 1.0) is False and view.count == 1  # itself is not a peer


def test_a_peers_route_counts_in_the_workers_load_until_their_next_heartbeat():
    registry = Registry(heartbeat_timeout_s=3.0, clock=FakeClock())
    registry.observe(hb("d1"))
    registry.observe(hb("p1", role=Role.PREFILL))
    registry.observe_peer_route("d1", "p1", prefill_s=0.4)
    registry.observe_peer_route("d1", None, prefill_s=0.1)
    registry.observe_peer_route("gone", None, prefill_s=0.1)  # an unknown worker: ignored
    d1, p1 = registry.get("d1"), registry.get("p1")
    assert (d1.load, p1.load, d1.inflight, registry.open_assignments()) == (2, 1, 0, 0)
    assert (round(d1.backlog(registry.clock()), 3), round(p1.backlog(registry.clock()), 3)) == (0.1, 0.4)
    registry.observe(hb("d1"))
    assert registry.get("d1").load == 0  # the worker's own report now counts it (or not)
