"""What a trace-like request costs the shared host outside the engines, from the path-load probe's
runs (pathload.py): MeshCost.host_cpu_s_per_request for the sim, where the host-load probe's is too
small.

The host-load probe (meshprobe.py) fits the host's CPU outside the engines per request, per busy
worker's engine step and per streamed token on short requests (32-token prompts, few at a time):
2.5-3.4 ms a request in runs BZ and CA. The path-load probe's requests are a trace's (a long cached
prefix, fresh tokens, 48 output tokens, 15-35 a second), and hostcpu.py reads the host's CPU outside
the engines over each of its runs: 29-37 ms a request. The per-step and per-token terms charged for
the engine steps the sim runs on those same requests explain 14-18 of it; the rest, 15-18 ms a
request in every run of both (each within 1 ms of the runs' median), is what a trace's request costs
beyond them: its body and block hashes through the gateway, the scheduler and the KV events, its
routing and its hand-back. Left out, the sim's 2-worker host ran those requests on spare cores it
does not have: its capacity was 44 req/s in both runs against a real 38.5 (BZ) and 33 (CA), and its
ITL at 80% load 3.2-3.6 ms against 4.2-4.6. With it (and the path-load term refitted on top) the
sim's capacity is 36 and 38 and its ITL there 3.9 and 4.6 ms; run CC, calibrated so, met every
2-worker goal, run CD each but the policy order (docs/simfidelity-runs.md, runs CA-CD).

NOTE: only the trace's requests are charged this: the steadier probes (the ITL probe's streams, a
lone request) are unslowed with the host-load probe's per-request term (meshcal.fit), as their own
requests' work is done before they are timed; charged there too, the fitted per-stream decode cost
fell 10x (its slope read as the streams' arrivals' CPU) and run CA's capacity went back to 42.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .cluster import Cluster, SimConfig
from .pathload import Request, run_keys, runs_of, trace_of, without_noise


def excess_per_request(cpu_s: float, requests: float, tokens: float, steps: float, per_step: float,
                       per_token: float) -> float:
    """A run's host CPU outside the engines per request, less its engine steps' and tokens' charges."""
    return (cpu_s - per_step * steps - per_token * tokens) / requests


def request_cpu_s(samples: Sequence[Sequence[float]], cpu_runs: Sequence[Sequence[float]], config: SimConfig,
                  policy: str = "kv_aware") -> float | None:
    """The median over the path-load runs with a CPU reading (`cpu_runs`: (run, requests served, tokens
    streamed, CPU s), Samples.load_cpu) of excess_per_request, the steps those the sim runs on that run's
    requests (no noise; decode and prefill steps of every decode worker); None without a reading."""
    by_key = {key: (position, run) for position, (key, run) in enumerate(zip(run_keys(samples), runs_of(samples)[0], strict=True))}
    quiet = without_noise(config)
    excess = [excess_per_request(cpu_s, requests, tokens, run_steps(quiet, *by_key[int(run)], policy),
                                 config.mesh.host_cpu_s_per_step, config.mesh.host_cpu_s_per_token)
              for run, requests, tokens, cpu_s in cpu_runs if requests > 0 and int(run) in by_key]
    return statistics.median(excess) if excess else None


def run_steps(config: SimConfig, position: int, requests: Sequence[Request], policy: str = "kv_aware") -> float:
    """The engine steps (decode and prefill, every decode worker) the sim runs on one path-load run's
    requests, the run at `position` in runs_of's order."""
    cluster = Cluster(policy, config)
    cluster.run(trace_of(position, requests, config.cost.block_size))
    figures = cluster.step_figures()
    return figures.decode.steps + figures.prefill.steps
