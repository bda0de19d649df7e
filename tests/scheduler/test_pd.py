from kvmesh.scheduler.pd import PdConfig, decide
from kvmesh.scheduler.policy import CostModel, RequestView, WorkerView

from .helpers import hashes

COST = CostModel(prefill_s_per_token=1e-4, block_size=16)
CONFIG = PdConfig(local_prefill_max_tokens=64, prefill_queue_max_s=1.0)
REQUEST = RequestView("r1", 16 * 10 + 3, hashes("p", 10))


def test_no_prefill_workers_means_local():
    assert decide(REQUEST, WorkerView("d1", 0), [], COST, CONFIG).local


def test_a_short_uncached_part_is_prefilled_locally():
    decode = WorkerView("d1", 0, cached_blocks=7)  # 163 - 112 = 51 uncached tokens <= 64
    decision = decide(REQUEST, decode, [WorkerView("p1", 0)], COST, CONFIG)
    assert decision.local and decision.reason == "short"


def test_a_long_prompt_goes_to_the_best_prefill_worker():
    prefill = [WorkerView("p1", 0, backlog_s=0.3), WorkerView("p2", 0, cached_blocks=8, backlog_s=0.2), WorkerView("p3", 0)]
    # p1: 0.3 + 163e-4 ; p2: 0.2 + 35e-4 ; p3: 0 + 163e-4 -> p3
    decision = decide(REQUEST, WorkerView("d1", 0), prefill, COST, CONFIG)
    assert (decision.prefill_id, decision.prefill_cached_blocks) == ("p3", 0)


def test_queued_prefill_workers_mean_local():
    prefill = [WorkerView("p1", 0, backlog_s=1.5), WorkerView("p2", 0, backlog_s=2.0)]
    decision = decide(REQUEST, WorkerView("d1", 0), prefill, COST, CONFIG)
    assert decision.local and decision.reason == "prefill_queued"


def test_kvstore_blocks_count_as_cheap_fetches():
    # p1 holds 6 blocks itself: 0.003 + 67 tokens * 1e-4 = 0.0097 s
    # p2 fetches the store's 10 blocks: 3 tokens * 1e-4 + 160 * 1e-4 * 0.2 = 0.0035 s
    prefill = [WorkerView("p1", 0, cached_blocks=6, backlog_s=0.003), WorkerView("p2", 0)]
    assert decide(REQUEST, WorkerView("d1", 0), prefill, COST, CONFIG).prefill_id == "p1"
    assert decide(REQUEST, WorkerView("d1", 0), prefill, COST, CONFIG, store_blocks=10).prefill_id == "p2"
