"""Pre-warming's pure core: hot prefixes by recent hits, the budget, and the router's hooks."""

import pytest

from kvmesh.scheduler.index import BlockIndex
from kvmesh.scheduler.policy import make_policy
from kvmesh.scheduler.prewarm import HotPrefixes, PrewarmConfig, Prewarmer, count_blocks
from kvmesh.scheduler.registry import Registry, Role
from kvmesh.scheduler.router import RouteQuery, Router, RouterConfig
from kvmesh.scheduler.sticky import StickySessions

from .helpers import FakeClock, hashes, hb, stored_batch

SYSTEM = hashes("system", 4)      # a shared system prompt: 4 blocks
CHAT_A = SYSTEM + hashes("a", 2)  # two conversations on it
CHAT_B = SYSTEM + hashes("b", 1)
RARE = hashes("rare", 3)
ALL = lambda _h: True  # noqa: E731


def hot_with(*prompts, now=0.0, half_life_s=300.0):
    hot = HotPrefixes(half_life_s)
    for prompt in prompts:
        hot.observe(prompt, now)
    return hot


def test_the_hottest_blocks_are_picked_as_whole_prefixes_hottest_first():
    hot = hot_with(CHAT_A, CHAT_A, CHAT_B, RARE)
    assert hot.hottest(100, 0.0, ALL) == [CHAT_A, RARE, CHAT_B]
    # With 7 blocks: the system prompt (hit 3x), conversation a (2x), then the shallowest 1x block.
    assert hot.hottest(7, 0.0, ALL) == [CHAT_A, RARE[:1]]
    assert hot.hottest(5, 0.0, ALL) == [CHAT_A[:5]]
    assert count_blocks(hot.hottest(7, 0.0, ALL)) == 7


def test_only_blocks_the_store_holds_and_whose_prefix_is_picked():
    hot = hot_with(CHAT_A, CHAT_A, CHAT_B)
    in_store = set(SYSTEM[:2]) | set(CHAT_A[4:])  # block 2 is missing: nothing after it is usable
    assert hot.hottest(100, 0.0, in_store.__contains__) == [SYSTEM[:2]]


def test_counts_are_recent_they_halve_every_half_life():
    hot = hot_with(RARE, RARE, RARE, RARE, now=0.0, half_life_s=10.0)
    hot.observe(CHAT_B, now=20.0)
    assert hot.heat(RARE[0], 20.0) == pytest.approx(1.0)
    hot.observe(CHAT_B, now=20.0)
    assert hot.hottest(5, 20.0, ALL) == [CHAT_B[:5]]


def test_a_bounded_table_forgets_the_coldest():
    hot = HotPrefixes(max_blocks=10)
    for i in range(3):
        hot.observe(SYSTEM, float(i))
    for i in range(10):
        hot.observe(hashes(f"once-{i}", 1), 5.0)
    assert len(hot) <= 10
    assert hot.hottest(4, 5.0, ALL) == [SYSTEM]


def test_a_full_table_keeps_its_hottest_half_and_never_a_block_without_its_parent():
    """Ties at the cut (fresh prompts hit once at one moment) go shallowest first."""
    hot = HotPrefixes(max_blocks=40)
    for i in range(3):
        hot.observe(SYSTEM + hashes(f"chat-{i}", 2), float(i))
    for i in range(7):  # 10 blocks, then 35 hit once at one moment, tied: the table overflows at the last
        hot.observe(hashes(f"fresh-{i}", 5), 3.0)
    assert len(hot) == 20  # the system prompt's 4, then 16 of the tied ones, shallowest first
    kept = hot._blocks
    assert all(heat.parent is None or heat.parent in kept for heat in kept.values())
    assert set(SYSTEM) <= set(kept)  # hit 3 times: hotter than anything seen once since
    assert hot.hottest(4, 3.0, ALL) == [SYSTEM]


def test_prewarmer_queues_joining_workers_and_times_their_warm_up():
    prewarmer = Prewarmer(PrewarmConfig(budget_blocks=4))
    prewarmer.joined("d0")
    assert prewarmer.take(1.0, ALL) == []  # nothing hot yet: warm at once
    assert not prewarmer.is_warming("d0")
    prewarmer.observe_route(CHAT_A, 1.0)
    prewarmer.joined("d1")
    prewarmer.joined("d1")
    assert prewarmer.take(2.0, ALL) == [("d1", [SYSTEM])]
    assert prewarmer.is_warming("d1")
    assert prewarmer.done("d1", 2.5) == pytest.approx(0.5)
    assert prewarmer.done("d1", 3.0) is None
    prewarmer.joined("d2")
    prewarmer.forget("d2")
    assert prewarmer.take(3.0, ALL) == []


def test_off_means_nothing_is_counted_or_queued():
    prewarmer = Prewarmer(PrewarmConfig(enabled=False))
    prewarmer.observe_route(CHAT_A, 0.0)
    prewarmer.joined("d0")
    assert (len(prewarmer.hot), prewarmer.pending) == (0, [])


def router_with_prewarm(clock):
    registry = Registry(clock=clock)
    return Router(registry, BlockIndex(), make_policy("kv_aware"), StickySessions(0), RouterConfig(), Prewarmer())


def test_router_counts_routes_and_plans_for_decode_workers_that_join_or_restart():
    clock = FakeClock()
    router = router_with_prewarm(clock)
    router.observe_heartbeat(hb("kvstore-0", Role.KVSTORE))
    router.observe_heartbeat(hb("d0"))
    router.observe_heartbeat(hb("p0", Role.PREFILL))
    assert router.prewarm_plans() == []  # d0 joined with nothing hot
    router.index.apply(stored_batch("kvstore-0", 1, CHAT_A))
    for i in range(2):
        router.route(RouteQuery(f"r{i}", 16 * len(CHAT_A), CHAT_A))
    router.observe_heartbeat(hb("d0"))  # an ordinary heartbeat: nothing to do
    router.observe_heartbeat(hb("d1"))  # scale-up
    router.observe_heartbeat(hb("d0", started_at=2.0))  # d0 restarted after a failure
    assert router.prewarm_plans() == [("d1", [CHAT_A]), ("d0", [CHAT_A])]
    # A warming worker is routed to like any other (cold but available): only held blocks count.
    decision = router.route(RouteQuery("r9", 16 * len(CHAT_A), CHAT_A, pool="production"))
    assert decision.decode.worker_id in {"d0", "d1"}
    clock.advance(10)
    router.sweep()
    assert router.prewarm.warming == {}
