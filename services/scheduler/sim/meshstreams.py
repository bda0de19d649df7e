"""What one calibration probe run's token timings say (meshprobe.py): a run's steady ITL and the
mesh's pauses in it, the largest gap of a stream during a window, the streams admitted together."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def itl_point(streams: int, itls: list[float]) -> tuple[float, float]:
    """One ITL sample: the median over the streams of a run (NaN ITLs, from 1-token answers, skipped)."""
    values = [x for x in itls if not math.isnan(x)]
    if not values:
        raise ValueError(f"no stream of the {streams}-stream run produced two tokens")
    return float(streams), statistics.median(values)


def steady_itl(token_times: list[list[float]], tokens: list[int] | None = None) -> float:
    """Mean gap between tokens while every stream of a run was decoding (after the last first
    token, before the first last token), the median over streams; NaN if that window is empty.
    `token_times` are chunk arrival times; the gateway coalesces a slow reader's tokens into one
    chunk, so with `tokens` (each stream's token count) a stream's chunk gap is scaled by its
    chunks per token."""
    return steady_run(token_times, tokens).itl_s


def largest_gap(token_times: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive token arrivals that overlaps [start, end]."""
    gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False) if b >= start and a <= end]
    return max(gaps, default=0.0)


def admitted_before_first_finish(first_token_s: list[float], finish_s: list[float]) -> int:
    """Streams of a burst that got their first token before any stream of it finished: those the
    mesh admitted at once (the others waited for a slot)."""
    first_finish = min(finish_s, default=math.inf)
    return sum(t < first_finish for t in first_token_s if not math.isnan(t))


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """A run's steady window (every stream decoding): its ITL without the pauses, how long it lasted,
    and each pause of a worker in it (how much longer than their ITL its streams' gaps were)."""

    itl_s: float
    window_s: float
    pauses_s: tuple[float, ...]


def steady_run(token_times: list[list[float]], tokens: list[int] | None = None, per_worker: float = 0.0,
               min_excess_s: float = 0.02, share: float = 0.75) -> SteadyRun:
    """steady_itl, less the mesh's pauses: gaps longer than a stream's median gap by `min_excess_s`
    that at least `share` of a worker's streams (`per_worker`; 0: no pauses looked for) have at one
    instant. Each such group is a pause of round(gaps / per_worker) workers, of the median excess."""
    # NOTE: the mesh stops all of a worker's streams together (its loop, not the client: a 1 ms sleep
    # loop in the client never overslept by 20 ms over the same seconds); the sim pauses them together
    start, end = max(t[0] for t in token_times), min(t[-1] for t in token_times)
    inside = [[t for t in times if start <= t <= end] for times in token_times]
    gaps = []  # (from, to, excess over the stream's median gap, stream)
    for i, times in enumerate(inside):
        if len(times) >= 3:
            typical = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
            gaps += [(a, b, b - a - typical, i) for a, b in zip(times, times[1:], strict=False) if b - a > typical + min_excess_s]
    need = max(2, math.ceil(share * per_worker)) if per_worker else math.inf
    pauses, removed, group = [], [0.0] * len(token_times), []
    for gap in [*sorted(gaps), None]:
        if group and (gap is None or gap[0] >= min(g[1] for g in group)):  # no instant shared with the group
            if len(group) >= need:
                pauses += [statistics.median(g[2] for g in group)] * max(1, round(len(group) / per_worker))
                for g in group:
                    removed[g[3]] += g[2]
            group = []
        if gap is not None:
            group.append(gap)
    means = []
    for i, times in enumerate(inside):
        per_chunk = tokens[i] / len(token_times[i]) if tokens and token_times[i] and tokens[i] >= len(token_times[i]) else 1.0
        if len(times) >= 3:
            means.append((times[-1] - times[0] - removed[i]) / (len(times) - 1) / per_chunk)
    return SteadyRun(statistics.median(means) if means else math.nan, max(0.0, end - start), tuple(pauses))
