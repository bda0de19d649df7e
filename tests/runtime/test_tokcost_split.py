"""bench/tokcost.py's split of the decode worker's CPU above the in-process engine."""

from __future__ import annotations

import pytest

from tests.scheduler.benchmodule import bench_module


def tokcost():
    return bench_module("tokcost")


def test_the_split_adds_up_to_the_decode_worker_above_the_engine() -> None:
    # in-process: 1,000 tokens in 25 full steps of 40, 2 ms of CPU a step (50 µs a token)
    engine = {"tokens": 1000, "steps": 25, "cpu_s": 0.050}
    # mesh: the same tokens in 40 steps of 25, 2.5 ms of engine CPU a step, 30 ms more in the worker
    mesh = {"tokens": 1000, "engine_steps": 40, "cpu_s": {"decode-0": 0.130, "gateway": 0.02},
            "engine_thread_cpu_s": {"decode-0: its engine thread": 0.100}}
    split = tokcost().decode_split(mesh, engine)
    assert split["batches"] == pytest.approx(30.0)  # 2 ms / 25 tokens = 80 µs a token, not 50
    assert split["CPU per step"] == pytest.approx(20.0)  # 0.5 ms more a step / 25 tokens
    assert split["beside the engine"] == pytest.approx(30.0)
    assert sum(split.values()) == pytest.approx(130.0 - 50.0)


def test_with_both_sides_step_cpu_the_split_is_steps_the_engine_process_beside_them_and_the_worker() -> None:
    # in-process: 1,000 tokens, 50 ms of CPU, 40 of it in its steps
    engine = {"tokens": 1000, "steps": 25, "cpu_s": 0.050, "step_cpu_s": 0.040}
    # mesh: its engine process 100 ms, 80 of it in steps (/metrics); the worker 30 ms more
    mesh = {"tokens": 1000, "engine_steps": 40, "cpu_s": {"decode-0": 0.130, "gateway": 0.02},
            "engine_thread_cpu_s": {"decode-0: its engine process": 0.100}, "engine_time_s": {"engine step cpu s": 0.080}}
    split = tokcost().decode_split(mesh, engine)
    assert split == pytest.approx({"engine steps": 40.0, "engine process beside its steps": 10.0, "beside the engine": 30.0})
    assert sum(split.values()) == pytest.approx(130.0 - 50.0)


def test_a_workers_step_cpu_is_read_from_its_metrics() -> None:
    out: dict[str, float] = {}
    tokcost().read_counts("decode-0", 'kvmesh_decode_engine_step_cpu_seconds_total{kind="decode"} 1.5\n'
                          'kvmesh_decode_engine_step_cpu_seconds_total{kind="prefill"} 0.25\n', out)
    assert out == {"decode-0 engine step cpu s": 1.75}


def test_no_split_without_a_step_count_or_an_engine() -> None:
    engine = {"tokens": 1000, "steps": 25, "cpu_s": 0.050}
    mesh = {"tokens": 1000, "engine_steps": 0, "cpu_s": {"decode-0": 0.130}, "engine_thread_cpu_s": {}}
    assert tokcost().decode_split(mesh, engine) == {}


def test_the_reference_is_the_in_process_run_with_the_median_cpu_per_token() -> None:
    runs = [{"tokens": 100, "cpu_s": 0.009, "wall_s": 1.0}, {"tokens": 100, "cpu_s": 0.005, "wall_s": 2.0},
            {"tokens": 100, "cpu_s": 0.006, "wall_s": 3.0}]
    chosen = tokcost().median_run(runs)
    assert chosen["wall_s"] == 3.0  # 60 µs a token: between 50 and 90
    assert chosen["cpu_per_token_runs"] == pytest.approx([90e-6, 50e-6, 60e-6])


def test_the_request_token_split_fits_known_costs_exactly() -> None:
    # gateway: 1.2 ms a request + 10 µs a token; worker: 0.5 ms + 8 µs; the engine (inside the worker's row): 0 + 60 µs
    def load(requests: int, tokens: int) -> dict:
        return {"requests": requests, "tokens": tokens,
                "cpu_s": {"gateway": requests * 1.2e-3 + tokens * 10e-6, "decode-0": requests * 0.5e-3 + tokens * 68e-6,
                          "decode-0: its engine": tokens * 60e-6}}

    split = tokcost().request_token_split([load(1024, 16384), load(64, 16384), load(128, 16384)])
    assert split["gateway"] == pytest.approx((1200.0, 10.0))
    assert split["decode-0"] == pytest.approx((500.0, 68.0))
    assert split["decode-0: its engine"] == pytest.approx((0.0, 60.0), abs=1e-6)


def test_the_request_token_split_needs_two_output_lengths() -> None:
    same = {"requests": 128, "tokens": 16384, "cpu_s": {"gateway": 0.3}}
    with pytest.raises(ValueError, match="two output lengths"):
        tokcost().request_token_split([same, dict(same, requests=64, tokens=8192)])
