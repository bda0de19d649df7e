"""What one calibration probe run's token timings say (meshprobe.py): a run's steady ITL, the
largest gap of a stream during a window, the streams admitted together."""

from __future__ import annotations

import math
import statistics


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
    start, end = max(t[0] for t in token_times), min(t[-1] for t in token_times)
    means = []
    for i, times in enumerate(token_times):
        inside = [t for t in times if start <= t <= end]
        per_chunk = tokens[i] / len(times) if tokens and times and tokens[i] >= len(times) else 1.0
        if len(inside) >= 3:
            means.append((inside[-1] - inside[0]) / (len(inside) - 1) / per_chunk)
    return statistics.median(means) if means else math.nan


def largest_gap(token_times: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive token arrivals that overlaps [start, end]."""
    gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False) if b >= start and a <= end]
    return max(gaps, default=0.0)


def admitted_before_first_finish(first_token_s: list[float], finish_s: list[float]) -> int:
    """Streams of a burst that got their first token before any stream of it finished: those the
    mesh admitted at once (the others waited for a slot)."""
    first_finish = min(finish_s, default=math.inf)
    return sum(t < first_finish for t in first_token_s if not math.isnan(t))
