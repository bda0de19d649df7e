"""A prefill step at a token count its worker has not run lately (MeshCost.prefill_s_new_shape):
charged once per such step, as the worker's time, with an LRU of the last kernel_cache_counts
counts per worker; measured by the calibration's new-shape probe."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.hostspeed import scaled
from kvmesh.scheduler.sim.meshcal import fit_new_shape
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.meshprobe import ProbeConfig
from kvmesh.scheduler.sim.shapes import ShapeCache, step_counts
from kvmesh.scheduler.sim.trace import TraceRequest

from .test_sim_calibrate import sim_outcomes
from .test_sim_meshprobe import FakeMesh

STEP = 0.01
PER_TOKEN = 1e-4
NEW = 0.004
COST = CostModel(prefill_s_per_token=PER_TOKEN, decode_s_per_step=STEP, decode_s_per_seq=0.0)


def request(at: float, name: str, tokens: int, output: int = 2) -> TraceRequest:
    """A fresh prompt (its blocks shared with no other request's)."""
    base = 1000 * (1 + zlib.crc32(name.encode()) % 1_000_000)
    return TraceRequest(at, name, "", tokens, output, tuple(range(base, base + tokens // 16)))


def by_name(trace: list[TraceRequest], new_shape: float = NEW, cache: int = 256, stall: float = 0.0,
            warm: bool = False) -> dict[str, object]:
    """Outcomes by request name; the worker's kernel cache starts empty unless `warm`."""
    config = SimConfig(num_workers=1, cost=COST, kernel_cache_counts=cache, warm_kernel_caches=warm,
                       mesh=MeshCost(prefill_s_new_shape=new_shape, prefill_stall=stall))
    names = {r.arrival_s: r.request_id for r in trace}
    return {names[o.arrival_s]: o for o in sim_outcomes(config, trace)}


def lone_ttft(tokens: int) -> float:
    return tokens * PER_TOKEN + STEP


def test_a_step_at_a_new_count_pays_once_and_a_count_run_before_does_not():
    t = by_name([request(0.0, "a", 100), request(1.0, "b", 100), request(2.0, "c", 101), request(3.0, "d", 101)])
    assert t["a"].ttft_s == pytest.approx(lone_ttft(100) + NEW)
    assert t["b"].ttft_s == pytest.approx(lone_ttft(100))  # the same count again: its kernels are cached
    assert t["c"].ttft_s == pytest.approx(lone_ttft(101) + NEW)  # one token more is a new shape
    assert t["d"].ttft_s == pytest.approx(lone_ttft(101))


def test_the_worker_forgets_the_least_recently_run_count_past_the_cache_size():
    counts = [100, 101, 100, 102, 100, 101]  # with room for 2: 102 evicts 101 (100 was run since), not 100
    trace = [request(float(i), f"r{i}", n) for i, n in enumerate(counts)]
    t = by_name(trace, cache=2)
    paid = [round((t[f"r{i}"].ttft_s - lone_ttft(n)) / NEW, 9) for i, n in enumerate(counts)]
    assert paid == [1, 1, 0, 1, 0, 1]
    roomy = by_name(trace, cache=256)
    assert [round((roomy[f"r{i}"].ttft_s - lone_ttft(n)) / NEW, 9) for i, n in enumerate(counts)] == [1, 1, 0, 1, 0, 0]


def test_it_is_the_workers_time_a_prefill_queued_behind_the_step_waits_for_it():
    # b arrives during a's step; its own step's count (50 + a decoding beside it) was run before
    trace = [request(0.0, "warm", 51), request(1.0, "a", 200), request(1.001, "b", 50)]
    t, free = by_name(trace), by_name(trace, new_shape=0.0)
    assert t["b"].first_token_s - free["b"].first_token_s == pytest.approx(NEW)  # a's new count
    assert t["b"].first_token_s == pytest.approx(t["a"].first_token_s + lone_ttft(50))


def test_a_stream_decoding_beside_the_step_stalls_for_it():
    trace = [request(0.0, "stream", 16, output=400), request(0.5, "p", 512)]
    t, free = by_name(trace, stall=1.0), by_name(trace, new_shape=0.0, stall=1.0)
    assert t["stream"].first_token_s - free["stream"].first_token_s == pytest.approx(NEW)  # its own prefill's new count
    # and its decode waits out p's step, the new count's cost included (prefill_stall 1: nothing overlaps)
    assert (t["stream"].finish_s - t["stream"].first_token_s) - (free["stream"].finish_s - free["stream"].first_token_s) \
        == pytest.approx(NEW)


def test_the_count_is_the_steps_new_tokens_with_its_decode_rows():
    # p prefills 100 tokens beside the stream's decode row: a step of 101; the stream ends by ~4 s
    trace = [request(0.0, "stream", 16, output=400), request(0.5, "p", 100), request(3.0, "q", 100),
             request(6.0, "r", 101), request(7.0, "s", 100)]
    t = by_name(trace)
    assert t["p"].ttft_s == pytest.approx(lone_ttft(100) + NEW)
    assert t["q"].ttft_s == pytest.approx(lone_ttft(100))  # 100 beside the row again: 101, run before
    assert t["r"].ttft_s == pytest.approx(lone_ttft(101))  # 101 alone: the same count
    assert t["s"].ttft_s == pytest.approx(lone_ttft(100) + NEW)  # 100 alone: never run


def test_a_step_that_prompts_join_before_it_begins_pays_once_for_its_final_count():
    # a's long step runs; b opens the next one (80 tokens and a's decode row: 81, a new count), c joins
    # it (129); later, alone, 81 and 129 tokens
    trace = [request(0.0, "a", 1000), request(0.01, "b", 80), request(0.02, "c", 48), request(2.0, "d", 81),
             request(3.0, "e", 129)]
    t = by_name(trace)
    a_end = lone_ttft(1000) + NEW
    assert t["b"].first_token_s == pytest.approx(a_end + STEP + 128 * PER_TOKEN + NEW) == t["c"].first_token_s
    assert t["d"].ttft_s == pytest.approx(lone_ttft(81) + NEW)  # the engine never ran a step of 81
    assert t["e"].ttft_s == pytest.approx(lone_ttft(129))       # but one of 129


def test_a_join_onto_a_count_run_before_takes_the_charge_back():
    trace = [request(0.0, "warm", 129), request(1.0, "a", 1000), request(1.01, "b", 80), request(1.02, "c", 48)]
    t = by_name(trace)
    a_end = 1.0 + lone_ttft(1000) + NEW
    assert t["b"].first_token_s == pytest.approx(a_end + STEP + 128 * PER_TOKEN) == t["c"].first_token_s


def test_by_default_the_cache_is_warm_with_the_traces_own_counts_as_a_mesh_in_steady_state_has_it():
    # NOTE: the fidelity bench's real replays find the engine's cache warm with the trace's counts (its
    # capacity search, or a policy run's warm-up replay, sent the same lengths before); run AV's saved
    # probes with a cold sim: capacity 11.0 req/s against a real 13.75, p50 +17% at 50% load
    trace = [request(0.0, "a", 300), request(1.0, "b", 500), request(2.0, "c", 300)]
    cold, warm = by_name(trace), by_name(trace, warm=True)
    assert cold["a"].ttft_s == pytest.approx(lone_ttft(300) + NEW) and cold["c"].ttft_s == pytest.approx(lone_ttft(300))
    assert [warm[n].ttft_s for n in "abc"] == pytest.approx([lone_ttft(300), lone_ttft(500), lone_ttft(300)])
    assert by_name([request(0.0, "a", 300)], warm=True)["a"].ttft_s == pytest.approx(lone_ttft(300))
    assert SimConfig().warm_kernel_caches


def test_zero_touches_no_cache_and_changes_nothing():
    trace = [request(0.01 * i, f"r{i}", 32 + 7 * i, output=20) for i in range(40)]
    clusters = [Cluster("round_robin", SimConfig(num_workers=2, cost=COST, kernel_cache_counts=n)) for n in (1, 256)]
    runs = [[(o.request.request_id, o.first_token_s, o.finish_s) for o in c.run(trace)] for c in clusters]
    assert runs[0] == runs[1]
    assert all(not w.shapes.counts for c in clusters for w in c.workers.values())


def test_the_host_speed_scales_it_as_a_time_term():
    _, mesh = scaled(CostModel(), MeshCost(prefill_s_new_shape=NEW), 2.0)
    assert mesh.prefill_s_new_shape == pytest.approx(2 * NEW)


def test_the_lru_undoes_a_steps_new_count_and_gives_back_what_it_evicted():
    cache = ShapeCache(2)
    assert cache.run([1]) == (1, (1, None)) and cache.run([2]) == (1, (2, None))
    assert cache.run([3]) == (1, (3, 1)) and list(cache.counts) == [2, 3]  # 1 evicted
    assert cache.run([2], (3, 1)) == (0, None) and list(cache.counts) == [1, 2]  # 3 forgotten, 1 back as the oldest
    assert cache.run([4, 4]) == (1, None) and list(cache.counts) == [2, 4]  # several steps: no undo
    assert step_counts(5000, 3, 2048) == [2048, 2048, 907] and step_counts(0, 2, 2048) == [3]


def test_the_fit_takes_the_median_pair_difference_and_never_a_negative_one():
    assert fit_new_shape([(128, 0.020, 0.016), (128, 0.030, 0.025), (384, 0.024, 0.021)]) == pytest.approx(0.004)
    assert fit_new_shape([(128, 0.015, 0.016)]) == 0.0 and fit_new_shape([]) == 0.0


def test_the_probe_sends_a_new_count_then_the_same_count_after_settling():
    config = ProbeConfig(lengths=(128,), shape_tokens=(128, 384), repeats=2, settle_s=0.3)
    mesh = FakeMesh(config, set())
    asyncio.run(mesh.ttft())
    before = len(mesh.sent)
    asyncio.run(mesh.shapes())
    pause = ("sleep", 0.3), ("wake", 8)
    # 128 and 129 went to the TTFT probe; the two lengths take turns, each request after a pause and a waker
    assert mesh.sent[before:] == [x for n in (130, 384, 131, 385) for x in (*pause, n, *pause, n)]
    ttft = {n: 0.010 + 2e-5 * n for n in (130, 131, 384, 385)}
    assert mesh.samples.shape == [(128, ttft[130], ttft[130]), (128, ttft[131], ttft[131]),
                                  (384, ttft[384], ttft[384]), (384, ttft[385], ttft[385])]


def test_a_stall_prefills_step_counts_its_rows_as_new_tokens():
    mesh = FakeMesh(ProbeConfig(), set())
    assert mesh.unseen(512, rows=2) == 512 and mesh.unseen(514) == 515  # 514 was the stall step's count
    assert mesh.unseen(512) == 512  # no step ran 512 tokens yet
