import pytest

from kvmesh.scheduler.index import BlockIndex
from kvmesh.scheduler.pd import PdConfig
from kvmesh.scheduler.policy import CostModel, make_policy
from kvmesh.scheduler.registry import Registry, Role
from kvmesh.scheduler.router import NoWorkerAvailable, RouteQuery, Router, RouterConfig
from kvmesh.scheduler.sticky import StickySessions

from .helpers import FakeClock, hashes, hb, stored_batch

P = hashes("p", 8)
TOKENS = 8 * 16 + 3


def make(policy: str = "kv_aware", workers=("d1", "d2", "d3"), sticky_ttl_s: float = 0.0) -> tuple[Router, FakeClock]:
    clock = FakeClock()
    config = RouterConfig(CostModel(prefill_s_per_token=1e-4, block_size=16), PdConfig(local_prefill_max_tokens=32), 2.0)
    router = Router(Registry(3.0, clock), BlockIndex(), make_policy(policy), StickySessions(sticky_ttl_s), config)
    for worker_id in workers:
        router.observe_heartbeat(hb(worker_id))
    return router, clock


def query(request_id: str, blocks=P, **fields) -> RouteQuery:
    return RouteQuery(request_id, TOKENS, blocks, **fields)


def test_routes_to_the_worker_whose_events_show_the_prefix():
    router, _ = make()
    router.index.apply(stored_batch("d2", 1, P))
    decision = router.route(query("r1"))
    assert (decision.decode.worker_id, decision.decode_cached_blocks, decision.local_prefill) == ("d2", 8, True)
    assert decision.decode.endpoint == router.registry.get("d2").info.endpoint


def test_a_same_prefix_burst_lands_together_before_any_event_arrives():
    # kv_aware, cost of r1 on d1 (r0's 8 blocks predicted, half its queued prefill counted):
    # 0.5 * 8.2 + (8 - 6.8) + 2 * 1 = 7.3 < 8 on an idle cold worker
    router, _ = make("kv_aware")
    first, second = router.route(query("r0")), router.route(query("r1"))
    assert (first.decode.worker_id, second.decode.worker_id) == ("d1", "d1")
    assert second.decode_cached_blocks == 0  # the reply only names confirmed blocks
    spread, _ = make("round_robin")
    assert [spread.route(query(f"r{i}")).decode.worker_id for i in range(3)] == ["d1", "d2", "d3"]


def test_sticky_sessions_keep_their_worker():
    router, clock = make("round_robin", sticky_ttl_s=60.0)
    first = router.route(query("r1", session_id="s1")).decode.worker_id
    clock.advance(1.0)
    second = router.route(query("r2", session_id="s1"))
    assert (second.decode.worker_id, second.sticky) == (first, True)


def test_a_sticky_session_yields_when_its_worker_is_well_past_its_fair_share():
    router, _ = make("round_robin", sticky_ttl_s=60.0)
    decisions = [router.route(query(f"r{i}", session_id="one-app")) for i in range(8)]
    # one app, one session: a worker keeps it until its load reaches 2x the mean (at least 1),
    # then the session moves on (d1 at 2 of 2 in flight; d2 at 4 of 6)
    assert [d.decode.worker_id for d in decisions] == ["d1", "d1", "d2", "d2", "d2", "d2", "d3", "d3"]
    assert [d.sticky for d in decisions] == [False, True, False, True, True, True, False, True]


def test_a_sticky_session_yields_when_its_worker_is_full():
    router, _ = make("round_robin", workers=("d1", "d2"), sticky_ttl_s=60.0)
    router.config = RouterConfig(router.config.cost, router.config.pd, 2.0, sticky_overload_factor=0.0)
    routed = [router.route(query(f"r{i}", session_id="s")).decode.worker_id for i in range(9)]
    assert routed[:8] == ["d1"] * 8 and routed[8] == "d2"  # hb() gives max_num_seqs 8


def test_no_decode_worker_is_unavailable_with_a_clear_message():
    router, _ = make(workers=())
    with pytest.raises(NoWorkerAvailable, match="no decode worker available in pool 'production'"):
        router.route(query("r1"))
    router, _ = make(workers=("d1",))
    with pytest.raises(NoWorkerAvailable, match=r"excluding d1"):
        router.route(query("r1", exclude=frozenset({"d1"})))


@pytest.mark.parametrize(
    ("q", "message"),
    [
        (RouteQuery("", 10), "request_id"),
        (RouteQuery("r", 0), "num_prompt_tokens"),
        (RouteQuery("r", 20, hashes("x", 2)), "more than the full blocks"),
        (RouteQuery("r", 20, (b"",)), "block hashes"),
    ],
)
def test_bad_input_is_a_value_error(q, message):
    router, _ = make()
    with pytest.raises(ValueError, match=message):
        router.route(q)


def test_a_dead_worker_and_its_index_entries_go_away():
    router, clock = make(workers=("d1", "d2"))
    router.index.apply(stored_batch("d1", 1, P))
    clock.advance(2.0)
    router.observe_heartbeat(hb("d2"))
    clock.advance(1.5)
    assert router.sweep() == ["d1"]
    assert router.index.held("d1") == set()
    assert router.route(query("r1")).decode.worker_id == "d2"


def test_complete_releases_the_load():
    router, _ = make(workers=("d1",))
    router.route(query("r1"))
    assert router.registry.get("d1").inflight == 1
    router.complete("r1")
    assert router.registry.get("d1").inflight == 0


def test_long_uncached_prompts_go_to_a_prefill_worker_short_ones_stay_local():
    router, _ = make(workers=("d1",))
    router.observe_heartbeat(hb("p1", role=Role.PREFILL))
    remote = router.route(query("r1"))
    assert (remote.prefill.worker_id, remote.local_prefill) == ("p1", False)
    router.index.apply(stored_batch("d1", 1, P[:7]))
    local = router.route(RouteQuery("r2", TOKENS, P))  # 131 - 112 = 19 uncached tokens <= 32
    assert local.local_prefill and local.pd_reason == "short"


def test_a_lagging_kv_event_seq_in_heartbeats_asks_for_a_replay():
    router, _ = make(workers=("d1",))
    router.index.apply(stored_batch("d1", 1, P[:1]))
    assert router.observe_heartbeat(hb("d1", kv_event_seq=3)) is None
    assert router.observe_heartbeat(hb("d1", kv_event_seq=3)) == 2
