"""bench/meshaging.py: a replay's line carries the client's figures, the steps, CPU per request and RSS."""

from __future__ import annotations

from types import SimpleNamespace

from .benchmodule import bench_module


def test_a_replays_line_has_its_figures_and_each_busy_processs_cpu_per_request() -> None:
    meshaging = bench_module("meshaging")
    summary = SimpleNamespace(ttft_p50_s=0.0221, ttft_p90_s=0.0344, itl_p50_s=0.00127,
                              steps={"gateway_ttft_ms": 18.04, "worker_ttft_ms": 10.8, "step_ms": 1.111, "rows": 1.5})
    line = meshaging.row(3, summary, {"gateway": 1.0, "kvstore": 2.0, "nats": 0.5}, {"gateway": 5.8, "kvstore": 2.4, "nats": 0.52},
                         480.0, {"gateway": 80.4, "kvstore": 1125.0})
    assert line == ("#3 p50 0.022 p90 0.034 itl 1.27 | gw 18.0 wk 10.8 step 1.11 rows 1.50 "
                    "| cpu ms/req gateway 10.0 kvstore 0.8 | rss MiB gateway 80 kvstore 1125")
