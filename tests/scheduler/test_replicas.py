"""Scheduler replicas: the live set and each replica's admission share."""

from kvmesh.scheduler.replicas import ReplicaSet

from ..fakeclock import FakeClock


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
