"""bench/simrequests.py: per-request sim vs real rows, written and read back, and grouped."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.report import outcome
from kvmesh.scheduler.sim.trace import SyntheticConfig, synthetic

BENCH = Path(__file__).resolve().parents[2] / "bench"


def simrequests():
    spec = importlib.util.spec_from_file_location("simrequests", BENCH / "simrequests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["simrequests"] = module
    spec.loader.exec_module(module)
    return module


def test_waiting_counts_the_others_still_before_their_first_token() -> None:
    # a: 0..5, b: 1..2, c: 3..4 -> b arrives while a waits, c while a waits (b is done)
    assert simrequests().waiting_at_arrival([0.0, 1.0, 3.0], [5.0, 2.0, 4.0]) == [0, 1, 1]


def test_rows_pair_each_trace_request_with_its_sim_and_real_outcomes(tmp_path) -> None:
    sr = simrequests()
    trace = synthetic(SyntheticConfig(duration_s=4.0, num_system_prompts=2, system_prompt_tokens=(64, 128),
                                      user_tokens=(16, 32), output_tokens=(4, 8), seed=3), 4.0)
    results = Cluster("kv_aware", SimConfig(num_workers=1)).run(trace)
    sims = {r.request.request_id: r for r in results}
    # a "real" replay twice as slow to its first token, its cache hits as the sim's
    real = [dataclasses.replace(o, first_token_s=o.arrival_s + 2 * o.ttft_s)
            for o in (outcome(sims[r.request_id]) for r in trace)]
    path = tmp_path / "run.1w.50.jsonl"
    sr.write(str(path), sr.rows(trace, results, [real, real]), (0.0, 100.0))
    window, data = sr.read(str(path))
    assert window == (0.0, 100.0) and len(data) == len(trace)
    first = data[0]
    assert first["turn"] == 1 and first["sim"]["ttft_s"] == sims[trace[0].request_id].ttft_s
    assert [x["ttft_s"] for x in first["real"]] == [2 * first["sim"]["ttft_s"]] * 2
    assert first["real"][0]["cached"] == first["sim"]["cached"]
    assert max(r["turn"] for r in data) >= 2  # follow-up turns are numbered in their session
    lines = list(sr.report(str(path)))
    all_row = next(line for line in lines if line.strip().startswith("all") and "p50" not in line)
    assert all_row.split()[-2:] == ["2.00", "2.00"]  # real/sim at p50 and p90
    streams = next(line for line in lines if "streams at arrival" in line)
    assert streams.count("2.00 / 2.00") == streams.count("(n ")  # every group's real/sim ratio, per request
