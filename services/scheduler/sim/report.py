"""Per-run figures and the capacity search: the highest request rate that still meets the SLO.

The figures are computed from per-request `Outcome`s, which the simulator and the real-mesh
replay (`replay.py`) both produce, so a sim row and a real row mean the same thing.
"""

from __future__ import annotations

import collections
import dataclasses
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
    imbalance: float             # max / mean of the workers' time-averaged load (nan: not known)
    ttft_p90_s: float = math.nan
    itl_p50_s: float = math.nan  # ITL = a request's mean gap between output tokens (after the first)
    itl_p99_s: float = math.nan
    goodput: float = math.nan    # requests/s that succeeded with TTFT <= the SLO
    errors: tuple[tuple[int, int], ...] = ()   # (HTTP status, requests), failed requests only
    steps: dict[str, float] | None = None      # what the decode workers' engine steps ran (steps.py: StepFigures.row)

    def meets(self, slo_s: float, quantile: float = 0.99) -> bool:
        """TTFT p99 (or p50) within `slo_s` and no request failed."""
        return not self.errors and (self.ttft_p99_s if quantile >= 0.99 else self.ttft_p50_s) <= slo_s


def quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as the client saw it (times in seconds on one clock)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    finish_s: float
    cached_tokens: int = 0
    status: int = 200

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def itl_s(self) -> float:
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1) if self.output_tokens > 1 else math.nan


def figures(policy: str, num_workers: int, outcomes: list[Outcome], window: tuple[float, float],
            slo_ttft_s: float = 0.5, imbalance: float = math.nan) -> RunSummary:
    """Figures over the requests that arrived in `window` (the steady part of the trace); rates
    and throughput per second of the window. Failed requests count in `rate` and `errors` only."""
    start, end = window
    span = max(end - start, 1e-9)
    arrived = [o for o in outcomes if start <= o.arrival_s < end] or outcomes
    served = [o for o in arrived if o.ok]
    ttfts = [o.ttft_s for o in served]
    itls = [o.itl_s for o in served if o.output_tokens > 1]
    statuses = sorted({o.status for o in arrived if not o.ok})
    finished = [o for o in outcomes if o.ok and start <= o.finish_s < end]
    return RunSummary(
        policy=policy,
        num_workers=num_workers,
        rate=len(arrived) / span,
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p99_s=quantile(ttfts, 0.99),
        throughput=len(finished) / span,
        output_tokens_per_s=sum(o.output_tokens for o in finished) / span,
        hit_rate=sum(o.cached_tokens for o in served) / max(1, sum(o.prompt_tokens for o in served)),
        imbalance=imbalance,
        ttft_p90_s=quantile(ttfts, 0.9),
        itl_p50_s=quantile(itls, 0.5),
        itl_p99_s=quantile(itls, 0.99),
        goodput=sum(o.ttft_s <= slo_ttft_s for o in served) / span,
        errors=tuple((s, sum(o.status == s for o in arrived)) for s in statuses),
    )


def outcome(result: RequestResult) -> Outcome:
    r = result.request
    # NOTE: what the client sees: its first visible text, hidden_s after the first token (MeshCost.hidden_tokens)
    return Outcome(r.arrival_s, r.prompt_tokens, r.output_tokens, result.first_token_s + result.hidden_s, result.finish_s,
                   result.cached_tokens, result.status)


def _mean_ms(values: list[float]) -> float:
    return 1e3 * sum(values) / len(values) if values else math.nan


def busiest_share(counts: list[float]) -> float:
    """The share of requests the busiest worker took, from each worker's count (nan: none counted)."""
    total = sum(counts)
    return max(counts) / total if total > 0 else math.nan


def summarize(policy: str, cluster: Cluster, results: list[RequestResult], window: tuple[float, float],
              slo_ttft_s: float = 0.5) -> RunSummary:
    """Figures over the requests that arrived in `window` (the steady part of the trace)."""
    loads = [cluster.window_load.get(w.worker_id, w.load_area) for w in cluster.workers.values() if w.role is Role.DECODE]
    mean_load = sum(loads) / len(loads)
    imbalance = max(loads) / mean_load if mean_load > 0 else 1.0
    summary = figures(policy, cluster.config.num_workers, [outcome(r) for r in results], window, slo_ttft_s, imbalance)
    start = min((r.request.arrival_s for r in results), default=0.0)
    steps = cluster.step_figures().row(cluster.now - start)
    served = [r for r in results if r.status == 200]
    steps["gateway_ttft_ms"] = _mean_ms([r.ttft_s for r in served])  # as the gateway's histogram has it
    steps["client_ttft_ms"] = _mean_ms([r.ttft_s + r.hidden_s for r in served])  # to the first visible text
    # NOTE: the engine's times are known for local prefills that reached their first token only
    steps["engine_queue_ms"] = _mean_ms([r.queue_s for r in results if not math.isnan(r.queue_s)])
    steps["engine_prefill_ms"] = _mean_ms([r.prefill_s for r in results if not math.isnan(r.prefill_s)])
    steps["busiest_share"] = busiest_share(list(collections.Counter(r.decode_id for r in served).values()))
    return dataclasses.replace(summary, steps=steps)


def simulate(policy: str, config: SimConfig, requests: list[TraceRequest], window: tuple[float, float] | None = None,
             slo_ttft_s: float = 0.5) -> RunSummary:
    """Replays `requests`; figures cover `window` (default: the whole trace)."""
    if window is None:
        window = (requests[0].arrival_s, requests[-1].arrival_s + 1e-9)
    cluster = Cluster(policy, config)
    results = cluster.run(requests, window)
    return summarize(policy, cluster, results, window, slo_ttft_s)


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
    imbal = "-" if math.isnan(summary.imbalance) else f"{summary.imbalance:.2f}"
    return (
        f"{summary.policy:<16}{summary.num_workers:>8}{summary.rate:>9.1f}{summary.ttft_p50_s:>10.3f}"
        f"{summary.ttft_p99_s:>10.3f}{summary.throughput:>9.1f}{summary.output_tokens_per_s:>10.0f}"
        f"{summary.hit_rate:>7.2f}{imbal:>7}{cap:>10}"
    )


DETAIL_HEADER = (
    f"{'policy':<16}{'workers':>8}{'rate':>9}{'ttft_p50':>10}{'ttft_p90':>10}{'ttft_p99':>10}{'itl_p50':>9}"
    f"{'itl_p99':>9}{'goodput':>9}  errors"
)


def detail_row(summary: RunSummary) -> str:
    """TTFT p90, ITL and goodput under the SLO; errors as status:count."""
    errors = " ".join(f"{status}:{n}" for status, n in summary.errors) or "-"
    return (
        f"{summary.policy:<16}{summary.num_workers:>8}{summary.rate:>9.1f}{summary.ttft_p50_s:>10.3f}"
        f"{summary.ttft_p90_s:>10.3f}{summary.ttft_p99_s:>10.3f}{summary.itl_p50_s:>9.4f}{summary.itl_p99_s:>9.4f}"
        f"{summary.goodput:>9.1f}  {errors}"
    )
