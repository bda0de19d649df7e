"""End-to-end calibration of the simulator's cost model: fits to what a client of the running mesh
measures through its gateway (`kvmesh sim calibrate --url GATEWAY`, shell in meshprobe.py).

The model (cluster.py, `CostModel` + `MeshCost`), as a lone client sees it:
- TTFT of a lone request with n uncached and c cached prompt tokens
      = request_overhead + n · prefill_s_per_token + c · hit_s_per_token + step(1)
- ITL (a request's mean gap between tokens) with k streams decoding = step(k)
      step(k) = decode_s_per_step + (decode_s_per_seq + token_overhead_s) · k
- a local prefill of n tokens stops the streams on that worker for prefill_stall · n · prefill_s_per_token
  (their largest gap grows by that much over their ITL)
- admission: the number of streams that got a first token before any of a burst finished.
`fit` inverts these formulas, so timings made by them give the parameters back exactly.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .calibrate import fit_line


@dataclass(slots=True)
class Samples:
    """What the probes measured."""

    ttft: list[tuple[float, float]] = field(default_factory=list)        # (uncached tokens, TTFT s), lone requests
    hit: list[tuple[float, float, float]] = field(default_factory=list)  # (cached, uncached tokens, TTFT s)
    itl: list[tuple[float, float]] = field(default_factory=list)         # (streams, ITL s)
    stall: list[tuple[float, float, float]] = field(default_factory=list)  # (prefill tokens, largest gap, ITL)
    admitted: int | None = None                                          # streams admitted at once (None: not probed)
    probe_streams: int = 0                                               # the burst size of that probe


@dataclass(frozen=True, slots=True)
class MeshCalibration:
    prefill_s_per_token: float
    decode_s_per_step: float
    decode_s_per_seq: float          # the engine's share when a lower bound is known, else all of it
    request_overhead_s: float
    token_overhead_s: float
    hit_s_per_token: float
    prefill_stall: float
    admission_limit: int | None      # None: not probed, or more than the probe sent

    def sim_flags(self) -> list[str]:
        """`kvmesh sim` flags that reproduce this mesh."""
        flags = [
            f"--prefill-s-per-token {self.prefill_s_per_token:.3g}", f"--decode-s-per-step {self.decode_s_per_step:.3g}",
            f"--decode-s-per-seq {self.decode_s_per_seq:.3g}", f"--request-overhead-s {self.request_overhead_s:.3g}",
            f"--token-overhead-s {self.token_overhead_s:.3g}", f"--hit-s-per-token {self.hit_s_per_token:.3g}",
            f"--prefill-stall {self.prefill_stall:.2f}",
        ]
        if self.admission_limit:
            flags.append(f"--admission-limit {self.admission_limit}")
        return flags


def step_s(cal: MeshCalibration, running: int) -> float:
    return cal.decode_s_per_step + (cal.decode_s_per_seq + cal.token_overhead_s) * running


def fit(samples: Samples, engine_decode_s_per_seq: float | None = None) -> MeshCalibration:
    """Inverts the model above. `engine_decode_s_per_seq` (the in-process lower bound) splits the
    per-stream ITL slope into the engine's part and the mesh's per-token overhead."""
    if len({n for n, _ in samples.ttft}) < 2 or len({k for k, _ in samples.itl}) < 2:
        raise ValueError("need TTFT at two prompt lengths and ITL at two stream counts at least")
    base, per_stream = fit_line(samples.itl)
    intercept, per_token = fit_line(samples.ttft)
    step_1 = base + per_stream
    engine = per_stream if engine_decode_s_per_seq is None else min(per_stream, engine_decode_s_per_seq)
    hits = [(ttft - intercept - uncached * per_token) / cached for cached, uncached, ttft in samples.hit if cached > 0]
    stalls = [(gap - itl) / (tokens * per_token) for tokens, gap, itl in samples.stall if tokens * per_token > 0]
    admitted = samples.admitted if samples.admitted is not None and samples.admitted < samples.probe_streams else None
    return MeshCalibration(
        prefill_s_per_token=per_token,
        decode_s_per_step=base,
        decode_s_per_seq=engine,
        request_overhead_s=max(0.0, intercept - step_1),
        token_overhead_s=per_stream - engine,
        hit_s_per_token=max(0.0, statistics.median(hits)) if hits else 0.0,
        prefill_stall=min(1.0, max(0.0, statistics.median(stalls))) if stalls else 0.0,
        admission_limit=admitted,
    )


def itl_point(streams: int, itls: list[float]) -> tuple[float, float]:
    """One ITL sample: the median over the streams of a run (NaN ITLs, from 1-token answers, skipped)."""
    values = [x for x in itls if not math.isnan(x)]
    if not values:
        raise ValueError(f"no stream of the {streams}-stream run produced two tokens")
    return float(streams), statistics.median(values)


def largest_gap(token_times: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive token arrivals that overlaps [start, end]."""
    gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False) if b >= start and a <= end]
    return max(gaps, default=0.0)


def admitted_before_first_finish(first_token_s: list[float], finish_s: list[float]) -> int:
    """Streams of a burst that got their first token before any stream of it finished: those the
    mesh admitted at once (the others waited for a slot)."""
    first_finish = min(finish_s)
    return sum(t < first_finish for t in first_token_s if not math.isnan(t))


def describe(cal: MeshCalibration, lower_bound: dict[str, float] | None) -> list[str]:
    """Human-readable lines: the end-to-end terms, and the in-process figures labelled as a lower bound."""
    lines = [
        "# end to end, through the gateway (what `kvmesh sim` should use for this mesh):",
        f"#   prefill {cal.prefill_s_per_token:.3g} s per uncached token, {cal.hit_s_per_token:.3g} s per cached token",
        f"#   decode step {cal.decode_s_per_step:.3g} s + {cal.decode_s_per_seq + cal.token_overhead_s:.3g} s per stream "
        f"(of which mesh per-token overhead {cal.token_overhead_s:.3g} s)",
        f"#   per-request overhead {cal.request_overhead_s:.3g} s (HTTP, tokenizing, routing, gRPC set-up)",
        f"#   a local prefill stalls the worker's streams for {cal.prefill_stall:.0%} of its time "
        "(engine and RPC loop share the worker's CPU)",
        "#   admission limit: " + (f"{cal.admission_limit} requests in flight" if cal.admission_limit
                                   else "not reached by the probe (or not probed)"),
    ]
    if lower_bound:
        lines += [
            "# in-process engine, no mesh (a LOWER BOUND on the mesh's costs, not a model of it):",
            "#   " + " ".join(f"--{k.replace('_', '-')} {v:.3g}" for k, v in lower_bound.items()),
        ]
    return lines
