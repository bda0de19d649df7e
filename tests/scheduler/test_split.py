"""A stepwise promote: the canary pool takes its share of production traffic, by session."""

import pytest

from kvmesh.scheduler.registry import Role
from kvmesh.scheduler.router import RouteQuery
from kvmesh.scheduler.split import PoolSplit, draw

from .helpers import hb
from .test_router import TOKENS, make


def sessions(n: int) -> list[str]:
    return [f"session-{i}" for i in range(n)]


def test_draws_are_stable_and_spread_evenly():
    assert draw("abc") == draw("abc") and draw("abc") != draw("abd")
    values = [draw(s) for s in sessions(2000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 450 < sum(v < 0.25 for v in values) < 550  # ~500 expected


@pytest.mark.parametrize("weight", [0.0, 0.1, 0.5, 1.0])
def test_the_canary_share_follows_the_weight_and_the_keys_below_it(weight):
    split = PoolSplit("production", "candidate", weight)
    chosen = {s: split.pool_for(s) for s in sessions(1000)}
    assert chosen == {s: "candidate" if draw(s) < weight else "production" for s in sessions(1000)}
    share = sum(p == "candidate" for p in chosen.values()) / 1000
    assert share == pytest.approx(weight, abs=0.05)


def test_raising_the_weight_only_moves_sessions_to_the_canary():
    low, high = PoolSplit("production", "candidate", 0.2), PoolSplit("production", "candidate", 0.6)
    moved_back = [s for s in sessions(500) if low.pool_for(s) == "candidate" and high.pool_for(s) == "production"]
    assert moved_back == []


@pytest.mark.parametrize(
    ("split", "message"),
    [
        (("", "", 0.0), "production pool is required"),
        (("production", "candidate", 1.5), r"canary_weight must be in \[0, 1\]"),
        (("production", "candidate", -0.1), r"canary_weight must be in \[0, 1\]"),
        (("production", "", 0.3), "needs a canary pool"),
        (("production", "production", 0.3), "must differ"),
    ],
)
def test_bad_splits_are_refused(split, message):
    with pytest.raises(ValueError, match=message):
        PoolSplit(*split)


def router_with_pools():
    router, clock = make(workers=())
    router.observe_heartbeat(hb("p1", pool="production"))
    router.observe_heartbeat(hb("c1", pool="candidate"))
    router.registry.split = PoolSplit("production", "candidate", 0.5)
    return router


def test_production_requests_split_by_session_and_a_session_stays_on_its_pool():
    router = router_with_pools()
    for i, s in enumerate(sessions(40)):
        decision = router.route(RouteQuery(f"r{i}", TOKENS, session_id=s))
        expected = "candidate" if draw(s) < 0.5 else "production"
        assert decision.pool == expected and decision.decode.worker_id == {"candidate": "c1", "production": "p1"}[expected]
        router.complete(f"r{i}")
        again = router.route(RouteQuery(f"r{i}-again", TOKENS, session_id=s))
        assert again.pool == expected
        router.complete(f"r{i}-again")


def test_without_a_session_the_request_id_decides_so_retries_stay_on_one_pool():
    router = router_with_pools()
    rid = next(f"r{i}" for i in range(100) if draw(f"r{i}") < 0.5)
    assert router.route(RouteQuery(rid, TOKENS)).pool == "candidate"
    assert router.route(RouteQuery(rid, TOKENS)).pool == "candidate"


def test_a_named_pool_and_a_canary_without_workers_are_respected():
    router = router_with_pools()
    to_candidate = next(s for s in sessions(100) if draw(s) < 0.5)
    assert router.route(RouteQuery("named", TOKENS, session_id=to_candidate, pool="production")).pool == "production"
    router.complete("named")
    # The canary's only worker is excluded (it just failed): production takes the request.
    decision = router.route(RouteQuery("r1", TOKENS, session_id=to_candidate, exclude=frozenset({"c1"})))
    assert decision.pool == "production"
    assert [w.worker_id for w in router.registry.live(Role.DECODE, "candidate")] == ["c1"]
