"""The request path under traffic: fits MeshCost.request_s_per_rps on the path-load probe.

The probe (meshprobe.py) sends short fresh requests at Poisson arrivals, at three rates, and times
each one's first token. The sim is run on those same requests (their arrival times, prompt and
output lengths, nothing cached) with every other term as fitted; what it lacks is the path
outside the engine slowing with the traffic around it, which the other probes (one request, or
one prefill beside steady streams, at a time) never load. The term is the `request_s_per_rps` at
which each run's median first token in the sim meets the probe's, in least squares over the runs
(each run's own requests a second set how much the term moves its median): Newton's method on a
function that is linear in the term but for the sim's own knock-on effects (a later first token
ends its turn later), so a few steps settle it, and timings the sim made with a known term give
that term back.

A sample is (run, arrival s within the run, prompt tokens, output tokens, TTFT s) per request.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from .cluster import Cluster, SimConfig
from .meshcost import HOST_LOAD_WINDOW_S
from .trace import TraceRequest

LoadSample = tuple[float, float, float, float, float]
MAX_STEPS = 8


def runs_of(samples: Sequence[Sequence[float]]) -> list[list[tuple[float, int, int, float]]]:
    """The probe's samples grouped by run, in run order: (arrival s, prompt tokens, output tokens, TTFT s)."""
    runs: dict[int, list[tuple[float, int, int, float]]] = {}
    for run, arrival, prompt, output, ttft in samples:
        runs.setdefault(int(run), []).append((float(arrival), int(prompt), int(output), float(ttft)))
    return [sorted(runs[k]) for k in sorted(runs)]


def trace_of(run: int, requests: Sequence[tuple[float, int, int, float]], block_tokens: int) -> list[TraceRequest]:
    """The run's requests as a trace: each prompt its own blocks (the probe's prompts are fresh)."""
    return [TraceRequest(arrival, f"load{run}-{i}", "", prompt, output,
                         tuple(range((run * 100_000 + i) * 1000, (run * 100_000 + i) * 1000 + prompt // block_tokens)))
            for i, (arrival, prompt, output, _) in enumerate(requests)]


def others_rate(arrivals: Sequence[float]) -> float:
    """The mean over requests of the requests a second that arrived in the HOST_LOAD_WINDOW_S before each."""
    if not arrivals:
        return 0.0
    counts = [sum(1 for b in arrivals[:i] if a - b <= HOST_LOAD_WINDOW_S) for i, a in enumerate(arrivals)]
    return statistics.fmean(counts) / HOST_LOAD_WINDOW_S


def sim_medians(config: SimConfig, traces: list[list[TraceRequest]], per_rps: float, policy: str) -> list[float]:
    """The sim's median TTFT (to the first token) of each run at `per_rps`."""
    mesh = replace(config.mesh, request_s_per_rps=per_rps)
    out = []
    for trace in traces:
        results = Cluster(policy, replace(config, mesh=mesh)).run(trace)
        out.append(statistics.median(r.ttft_s for r in results if r.status == 200))
    return out


def fit_request_s_per_rps(samples: Sequence[Sequence[float]], config: SimConfig, policy: str = "kv_aware",
                          medians: Callable[[SimConfig, list[list[TraceRequest]], float, str], list[float]] = sim_medians) -> float:
    """The term (>= 0) at which the sim's per-run median TTFTs meet the probe's (least squares);
    0 without samples."""
    runs = [r for r in runs_of(samples) if r]
    if not runs:
        return 0.0
    real = [statistics.median(t for *_, t in r) for r in runs]
    rates = [others_rate([a for a, *_ in r]) for r in runs]
    if not any(rates):
        return 0.0
    traces = [trace_of(i, r, config.cost.block_size) for i, r in enumerate(runs)]
    per_rps = 0.0
    base = medians(config, traces, per_rps, policy)
    for _ in range(MAX_STEPS):
        # NOTE: d(median)/d(per_rps) is about each run's rate (its median request's own rate); the sim's
        # knock-on effects bend it a little, which the next step corrects
        step = sum(x * (y - s) for x, y, s in zip(rates, real, base, strict=True)) / sum(x * x for x in rates)
        nxt = max(0.0, per_rps + step)
        if abs(nxt - per_rps) <= 1e-9 or (nxt == 0.0 and per_rps == 0.0):
            return nxt
        per_rps, base = nxt, medians(config, traces, nxt, policy)
    return per_rps
