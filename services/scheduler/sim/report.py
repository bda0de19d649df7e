"""Per-run figures and the capacity search: the highest request rate that still meets the SLO."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..registry import Role
from .cluster import Cluster, RequestResult, SimConfig
from .trace import TraceRequest


@dataclass(frozen=True, slots=True)
class RunSummary:
    policy: str
    num_workers: int
    rate: float                  # offered requests/s
    ttft_p50_s: float
    ttft_p99_s: float
    throughput: float            # finished requests/s
    output_tokens_per_s: float
    hit_rate: float              # prompt tokens served from a cache / prompt tokens
    imbalance: float             # max / mean of the workers' time-averaged load

    def meets(self, slo_s: float, quantile: float = 0.99) -> bool:
        return (self.ttft_p99_s if quantile >= 0.99 else self.ttft_p50_s) <= slo_s


def quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(policy: str, cluster: Cluster, results: list[RequestResult], window: tuple[float, float]) -> RunSummary:
    """Figures over the requests that arrived in `window` (the steady part of the trace)."""
    start, end = window
    span = max(end - start, 1e-9)
    all_results = results
    results = [r for r in results if start <= r.request.arrival_s < end] or results
    ttfts = [r.ttft_s for r in results]
    prompt = sum(r.request.prompt_tokens for r in results)
    loads = [cluster.window_load.get(w.worker_id, w.load_area) for w in cluster.workers.values() if w.role is Role.DECODE]
    mean_load = sum(loads) / len(loads)
    return RunSummary(
        policy=policy,
        num_workers=cluster.config.num_workers,
        rate=len(results) / span,
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p99_s=quantile(ttfts, 0.99),
        throughput=sum(start <= r.finish_s < end for r in all_results) / span,
        output_tokens_per_s=sum(r.request.output_tokens for r in all_results if start <= r.finish_s < end) / span,
        hit_rate=sum(r.cached_tokens for r in results) / max(1, prompt),
        imbalance=max(loads) / mean_load if mean_load > 0 else 1.0,
    )


def simulate(policy: str, config: SimConfig, requests: list[TraceRequest], window: tuple[float, float] | None = None) -> RunSummary:
    """Replays `requests`; figures cover `window` (default: the whole trace)."""
    if window is None:
        window = (requests[0].arrival_s, requests[-1].arrival_s + 1e-9)
    cluster = Cluster(policy, config)
    results = cluster.run(requests, window)
    return summarize(policy, cluster, results, window)


def capacity(
    run_at: Callable[[float], RunSummary], slo_s: float, start_rate: float, steps: int = 4
) -> tuple[float, RunSummary | None]:
    """Highest rate whose TTFT p99 meets `slo_s`: doubles from `start_rate` until it fails, then
    bisects `steps` times. Returns (rate, the summary at that rate) or (0, None) if even
    `start_rate` fails after halving a few times."""
    low, best, high = 0.0, None, None
    rate = start_rate
    for _ in range(16):
        summary = run_at(rate)
        if summary.meets(slo_s):
            low, best = rate, summary
            if high is not None:
                break
            rate *= 2.0
        else:
            high = rate
            if low > 0:
                break
            rate /= 2.0
            if rate < start_rate / 64:
                return 0.0, None
    for _ in range(steps):
        mid = (low + high) / 2.0  # type: ignore[operator]
        summary = run_at(mid)
        if summary.meets(slo_s):
            low, best = mid, summary
        else:
            high = mid
    return low, best


HEADER = (
    f"{'policy':<16}{'workers':>8}{'rate':>9}{'ttft_p50':>10}{'ttft_p99':>10}{'thru':>9}{'tok/s':>10}"
    f"{'hit':>7}{'imbal':>7}{'capacity':>10}"
)


def row(summary: RunSummary, capacity_rate: float | None) -> str:
    cap = "-" if capacity_rate is None else f"{capacity_rate:.1f}"
    return (
        f"{summary.policy:<16}{summary.num_workers:>8}{summary.rate:>9.1f}{summary.ttft_p50_s:>10.3f}"
        f"{summary.ttft_p99_s:>10.3f}{summary.throughput:>9.1f}{summary.output_tokens_per_s:>10.0f}"
        f"{summary.hit_rate:>7.2f}{summary.imbalance:>7.2f}{cap:>10}"
    )
