"""sim/workertime.py: what a step and a prefill cost a simulated worker, hand-computed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.registry import Role
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.simworker import SimWorker
from kvmesh.scheduler.sim.trace import TraceRequest
from kvmesh.scheduler.sim.workertime import (
    context_tokens,
    hidden_count,
    host_slowdown,
    measured_slowdown,
    noise_factor,
    prefill_s,
    step_s,
)

COST = CostModel(prefill_s_per_token=1e-4, decode_s_per_step=2e-3, decode_s_per_seq=1e-4)


def worker(running: int, role: Role = Role.DECODE, contexts: list[float] | None = None) -> SimWorker:
    w = SimWorker("d000", role, kv_blocks=64, max_num_seqs=8, running=running)
    w.contexts = list(contexts or [])
    return w


def test_a_step_is_the_engines_plus_the_mesh_per_running_sequence():
    mesh = MeshCost(token_overhead_s=5e-5)
    assert step_s(COST, mesh, worker(3)) == pytest.approx(2e-3 + 3 * 1e-4 + 3 * 5e-5)


def test_a_prefill_pays_a_ride_along_step_per_chunk_and_a_joining_one_only_its_own_work():
    mesh = MeshCost(prefill_share=0.5, prefill_s_per_stream=1e-3)
    d = worker(3)  # the prefilling request and 2 streams beside it
    own = 300 * 1e-4 * (1 + 0.5 * 2)
    one_step = 2e-3 + 3 * 1e-4
    assert prefill_s(COST, mesh, 128, d, 300, 0) == pytest.approx(own + 2 * 1e-3 + 3 * one_step)  # 3 chunks of 128
    assert prefill_s(COST, mesh, 128, d, 300, 0, joining=True) == pytest.approx(own)
    assert prefill_s(COST, MeshCost(), 128, worker(1), 0, 512) == pytest.approx(2e-3 + 1e-4)  # all cached: one step


def test_the_quadratic_attention_counts_cached_pairs_at_their_own_price_when_set():
    d = worker(1)
    base = prefill_s(COST, MeshCost(), 2048, d, 100, 50)
    assert prefill_s(COST, MeshCost(attention_s_per_pair=1e-7), 2048, d, 100, 50) - base == pytest.approx(
        1e-7 * (100 * 100 / 2 + 100 * 50))
    assert prefill_s(COST, MeshCost(attention_s_per_pair=1e-7, attention_s_per_cached_pair=0.0), 2048, d, 100, 50) - base \
        == pytest.approx(1e-7 * 100 * 100 / 2)


def test_a_shared_host_slows_its_busy_decode_workers_past_its_parallelism():
    busy = [worker(2), worker(1), worker(4), worker(0), worker(3, Role.PREFILL)]
    assert host_slowdown(COST, MeshCost(host_parallelism=2.0), busy) == pytest.approx(1.5)  # 3 busy decode workers
    assert host_slowdown(COST, MeshCost(host_parallelism=4.0), busy) == 1.0
    assert host_slowdown(COST, MeshCost(), busy) == 1.0  # each worker on a host of its own


def test_the_mesh_own_work_at_the_recent_request_rate_takes_from_the_shared_hosts_cores():
    busy = [worker(2), worker(1), worker(0)]
    shared = MeshCost(host_parallelism=1.9, host_cpu_s_per_request=0.05)
    assert host_slowdown(COST, shared, busy, request_rate=10.0) == pytest.approx((2 + 0.5) / 1.9)
    assert host_slowdown(COST, shared, busy, request_rate=0.0) == pytest.approx(2 / 1.9)
    assert host_slowdown(COST, shared, [worker(1), worker(0)], request_rate=10.0) == 1.0  # 1.5 cores of 1.9: room
    assert host_slowdown(COST, MeshCost(host_cpu_s_per_request=0.05), busy, request_rate=10.0) == 1.0  # a host each


def test_the_mesh_per_step_work_slows_with_the_steps_it_serves():
    busy = [worker(2), worker(1), worker(0)]
    mesh = MeshCost(host_parallelism=2.0, host_cpu_s_per_step=1e-3, host_cpu_s_per_token=1e-4)
    # per busy worker (per_step + per_token × rows) / its step: (1e-3 + 2e-4) / 2.2e-3 and (1e-3 + 1e-4) / 2.1e-3
    a = (1.2e-3 / step_s(COST, mesh, busy[0])) + (1.1e-3 / step_s(COST, mesh, busy[1]))
    s = host_slowdown(COST, mesh, busy)
    assert s == pytest.approx((2 + a / s) / 2.0, rel=1e-12)  # the fixed point: its steps slow too
    assert 1.0 < s < (2 + a) / 2.0
    assert host_slowdown(COST, mesh, [worker(1)]) == 1.0  # one busy worker, 1.5 cores of 2: room


@pytest.mark.parametrize(("rows", "parallel", "rate"),
                         [(1, 1.0, 1.0), (3, 1.0, 8.0), (5, 1.5, 10.0), (1, 2.0, 2.0), (16, 1.9, 32.0)])
def test_a_step_measured_on_the_shared_host_gives_back_the_slowdown_behind_it(rows, parallel, rate):
    # meshcal.fit unslows the ITL probe's steps so: the sim slows the unslowed step back to what was measured
    mesh = MeshCost(host_parallelism=parallel, host_cpu_s_per_request=4e-3, host_cpu_s_per_step=6e-4, host_cpu_s_per_token=9e-5)
    busy = [worker(rows), worker(rows)]
    s = host_slowdown(COST, mesh, busy, request_rate=rate)
    measured = s * step_s(COST, mesh, busy[0])
    assert measured_slowdown(mesh, 2, rows, rate, measured) == pytest.approx(s, rel=1e-12)
    assert measured_slowdown(MeshCost(), 2, rows, rate, measured) == 1.0  # a host each


def test_the_per_token_host_cost_is_charged_a_message_at_a_time_once_a_worker_coalesces():
    # rows >= stream_interval_from: a message (and an SSE chunk) every stream_interval tokens
    mesh = MeshCost(host_parallelism=2.0, host_cpu_s_per_token=1e-4, stream_interval=4, stream_interval_from=3)
    busy = [worker(4), worker(2)]
    a = 4 * 1e-4 / 4 / step_s(COST, mesh, busy[0]) + 2 * 1e-4 / step_s(COST, mesh, busy[1])
    s = host_slowdown(COST, mesh, busy)
    assert s == pytest.approx((2 + a / s) / 2.0, rel=1e-12)
    every_token = host_slowdown(COST, replace(mesh, stream_interval=1), busy)
    assert every_token > s


def test_the_sims_stream_interval_defaults_are_the_decode_workers():
    from kvmesh.decode.config import DecodeSettings  # noqa: PLC0415

    fields = DecodeSettings.model_fields
    assert (MeshCost().stream_interval, MeshCost().stream_interval_from) == (
        fields["stream_interval"].default, fields["stream_interval_from"].default)


def test_each_request_draws_its_noise_and_hidden_tokens_by_id_alike_every_run():
    mesh = MeshCost(noise=(0.5, 1.0, 2.0), hidden_tokens=(0, 1, 2, 3))
    ids = [f"r{i}" for i in range(40)]
    assert [noise_factor(mesh, i) for i in ids] == [noise_factor(mesh, i) for i in ids]
    assert {noise_factor(mesh, i) for i in ids} == {0.5, 1.0, 2.0}
    assert {hidden_count(mesh, i) for i in ids} == {0, 1, 2, 3}
    assert noise_factor(MeshCost(), "r0") == 1.0 and hidden_count(MeshCost(), "r0") == 0


def test_a_sequence_decodes_over_its_prompt_and_half_its_output():
    assert context_tokens(TraceRequest(0.0, "r", "s", 1000, 64, ())) == 1032
