from kvmesh.scheduler.sticky import StickySessions


def test_a_session_sticks_until_it_is_idle_longer_than_the_ttl():
    sticky = StickySessions(ttl_s=10.0)
    sticky.put("s1", "d1", now=0.0)
    assert sticky.get("s1", now=9.0) == "d1"
    sticky.put("s1", "d1", now=9.0)
    assert sticky.get("s1", now=18.0) == "d1"
    assert sticky.get("s1", now=28.5) is None
    assert len(sticky) == 0


def test_forgetting_a_worker_unsticks_its_sessions():
    sticky = StickySessions(ttl_s=10.0)
    sticky.put("s1", "d1", 0.0)
    sticky.put("s2", "d2", 0.0)
    sticky.forget_worker("d1")
    assert (sticky.get("s1", 1.0), sticky.get("s2", 1.0)) == (None, "d2")


def test_ttl_zero_disables_stickiness_and_empty_ids_never_stick():
    assert StickySessions(ttl_s=0.0).get("s1", 0.0) is None
    sticky = StickySessions(ttl_s=5.0)
    sticky.put("", "d1", 0.0)
    assert len(sticky) == 0


def test_the_least_recently_used_session_goes_when_full():
    sticky = StickySessions(ttl_s=100.0, max_sessions=2)
    sticky.put("a", "d1", 0.0)
    sticky.put("b", "d1", 1.0)
    sticky.put("a", "d1", 2.0)
    sticky.put("c", "d1", 3.0)
    assert (sticky.get("a", 4.0), sticky.get("b", 4.0), sticky.get("c", 4.0)) == ("d1", None, "d1")
