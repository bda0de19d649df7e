"""End-to-end calibration of the simulator's cost model: fits to what a client of the running mesh
measures through its gateway (`kvmesh sim calibrate --url GATEWAY`, shell in meshprobe.py).

The model (cluster.py, `CostModel` + `MeshCost`), as a client sees it, with W decode workers on
one host that runs P busy ones at full speed (W = 1: P = 1 when the host-load probe found the engine
on this host, else 0, no shared host). The host's slowdown s is the sim's (workertime.host_slowdown):
with b busy workers, r requests in the last second and the host CPU outside the engines that the
host-load probe measured (per request, per engine step, per token: fit_host),
s = max(1, (b + per_request · r + Σ_busy step_host_s(its rows) / (its unslowed step · s)) / P), solved
for s; s = 1 without a shared host. Every probe below is slowed by the s of its own
state, so the fit takes that s out of what it measured (NOTE: before, it took out b / P only, and the
sim then charged the host CPU terms on top of steps that already held them: its steady steps ran
1.1-1.7x the ITL probe's at one worker, its lone prefills 1.35x; bench/sim_calibration.md item 12):
- TTFT of a lone request with n uncached and c cached prompt tokens
      = request_overhead + request_busy + s_1 · (n · prefill_s_per_token + attention_s_per_pair · n² / 2
        + attention_s_per_cached_pair · n · c + c · hit_s_per_token + step(1) + new_shape),
  s_1 the slowdown of one busy worker of one row (step(1)) and one request in the last second,
  new_shape = prefill_s_new_shape when the worker has not run a step of n new tokens lately (every
  timed prefill of the probes is at a count not sent before, meshprobe.py), else 0; the shape probe
  sends a lone request at a count never sent, then one at that count again: the first's TTFT less
  the second's is the term (fit_new_shape);
- ITL (a request's mean gap between tokens) with k streams of mean context x decoding, spread over
  b = min(k, W) workers = s · (step(k / b) + hinge(x · k / b)), s that of b busy workers of k / b
  rows and k requests in the last second (measured_slowdown solves it from the measured step),
  step(k) = decode_s_per_step + (decode_s_per_seq + token_overhead_s) · k,
  hinge(t) = decode_s_per_kv_token · t + decode_s_per_padded_token · max(0, t − decode_padded_knee_tokens)
  (decodectx.py: a worker's k / b streams of context x read k / b × x padded KV tokens); the ITL
  probe's short streams (context x0, k / b × x0 below the knee) fit the line step(k) + hinge(k x0),
  long ones at several (k, x) the rest of the hinge (_fit_context); the other probes' streams are
  short and take that line, as the ITL probe measured it;
- W long prompts (n tokens) sent at once, one per worker: the last first token comes
  (W - 1) · request_busy + (s_W - s_1) · (lone prefill work + step(1) + new_shape) after a lone request's,
  s_W that of W busy workers of one row and W requests (P by bisection: _fit_parallel);
- a prompt whose first c tokens are cached takes c · hit_s_per_token + attention_s_per_cached_pair · n · c
  longer than a fresh prompt of its n uncached tokens (the hit probe sends one right after each hit;
  its two shapes, n = 16 and 512 after ~1,000-1,500 cached, tell the two terms apart);
- a burst of M short requests (n tokens, one output token) sent at once: the last first token
  comes (M - 1) · request_busy after a lone request's TTFT at a count run before (the mesh-wide
  request server; the burst repeats one length, so its steps' counts are not new; NOTE: the host's
  slowdown of its short prefills, which M arrivals raise in the sim, is left out);
- a prefill of n tokens arriving while k ≥ 1 streams decode over b workers (k / b beside it) takes
  s · (work(n) · (1 + prefill_share · k / b) + prefill_s_per_stream · k / b + prefill_s_beside
  + step(k / b + 1) + prefill_s_new_shape), s that of b busy workers (its own of k / b + 1 rows, the
  others' of k / b, each step the short streams' line) and k + 1 requests, and the streams beside it
  stop for prefill_stall of that time less prefill_s_beside, which is latency only (their largest gap
  grows by that much over their ITL); the probe sends it beside several stream counts, 0 included (its
  lone work(n), measured beside the others), at two lengths: the term proportional to the prefill's
  work and the additive one per stream are told apart by the length, the once-off one by the stream
  counts (fit_beside);
- pauses: the ITL probe's runs (4 or more streams per worker) show gaps that most of a worker's
  streams share (meshstreams.steady_run); their count over the worker-seconds searched is the rate,
  their mean extra gap the length, and the ITL above is measured without them;
- KV hand-back (handback.py): k turns of t tokens per worker ending at once hold each worker busy
  for k · (handback_s_per_turn + handback_s_per_token · t): a lone stream sent right after them
  ends that much later than one sent once the worker has settled;
- admission: the number of streams that got a first token before any of a burst finished;
- visibility: a client sees a request's first token only once its text is not empty; the probe's
  lone requests give how many tokens came before that (hidden_tokens, as deciles), and the sim
  adds that many of its worker's decode steps to the TTFT a client sees (the TTFT probes time the
  first token itself).
`fit` inverts these formulas, so timings made by them give the parameters back exactly.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..policy import CostModel
from .calibrate import fit_line
from .decodectx import fit_hinge
from .handback import fit_handback
from .meshcost import HOST_LOAD_WINDOW_S, MeshCost
from .meshstats import around_median, medians, noise_quantiles, nonnegative_fit
from .workertime import measured_slowdown, shared_slowdown, step_host_s

if TYPE_CHECKING:
    from .cluster import SimConfig


PATH_LOAD_SEQS_PER_WORKER = 64  # the decode worker's max_num_seqs default, as the path-load probe's mesh runs


@dataclass(slots=True)
class Samples:
    """What the probes measured: every repeat of every probe point (the fit takes each point's median)."""

    ttft: list[tuple[float, float]] = field(default_factory=list)        # (uncached tokens, TTFT s), lone requests
    hit: list[tuple[float, float, float]] = field(default_factory=list)  # (cached, uncached tokens, TTFT s)
    hit_lone: list[float] = field(default_factory=list)  # TTFT of a fresh prompt of each hit's uncached length, sent next
    itl: list[tuple[float, float]] = field(default_factory=list)         # (streams, ITL s), one per run
    itl_context: float = 0.0                                             # mean context of those streams
    itl_long: list[tuple[float, float, float]] = field(default_factory=list)  # (streams, mean context, ITL s)
    burst: list[tuple[float, float, float]] = field(default_factory=list)  # (requests, prompt tokens, last TTFT)
    pair: list[tuple[float, float, float]] = field(default_factory=list)   # (long prompts at once, tokens, last TTFT)
    workers: int = 1                                                     # decode workers behind the gateway
    # (requests, busy workers' engine steps, streamed tokens, host CPU s outside the engines), per run
    # (a 2-tuple, as stop 34's first probe saved it: (requests, CPU s))
    host: list[tuple[float, ...]] = field(default_factory=list)
    stall: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    # (prefill tokens, streams decoding meanwhile, the largest gap of any, their ITL, the prefill's TTFT)
    admitted: int | None = None                                          # streams admitted at once (None: not probed)
    probe_streams: int = 0                                               # the burst size of that probe
    reprobed: list[str] = field(default_factory=list)  # a probe point's name per extra repeat (its repeats disagreed)
    pause_window_s: float = 0.0  # worker-seconds of the ITL probe's steady decoding searched for pauses
    pauses: list[float] = field(default_factory=list)  # each worker pause found there: its streams' extra gap, s
    handback: list[tuple[float, float, float]] = field(default_factory=list)
    # (turns per worker ending at once, tokens per turn, a lone stream's extra latency right after them)
    shape: list[tuple[float, float, float]] = field(default_factory=list)
    # (nominal uncached tokens, TTFT at a token count never sent, TTFT at that count again right after)
    visible: list[int] = field(default_factory=list)  # tokens streamed before the first visible text, per request
    load: list[tuple[float, ...]] = field(default_factory=list)
    # (run, rate level, arrival s within the run, cached prefix tokens, fresh tokens, output tokens, TTFT s)
    # per request of the path-load probe (pathload.py)
    load_cpu: list[tuple[float, float, float, float]] = field(default_factory=list)
    # (run, requests served, tokens streamed, host CPU s outside the engines) per path-load run, when the
    # engines run on this host (hostcpu.py): what a trace-like request costs the host (with several workers
    # the sim's host_cpu_s_per_request: pathcpu.py, fit_path_load)


@dataclass(frozen=True, slots=True)
class MeshCalibration:
    prefill_s_per_token: float
    decode_s_per_step: float
    decode_s_per_seq: float          # the engine's share when a lower bound is known, else all of it
    request_overhead_s: float
    request_busy_s: float
    token_overhead_s: float
    hit_s_per_token: float
    prefill_stall: float
    prefill_share: float             # a prefill takes (1 + this × streams beside it) times as long ...
    admission_limit: int | None      # None: not probed, or more than the probe sent
    noise: tuple[float, ...] = ()    # TTFT deciles: the path-load probe's around the sim's (pathload.residual_noise), else ttft_noise
    attention_s_per_pair: float = 0.0
    decode_s_per_kv_token: float = 0.0      # a decode step's cost per padded KV token (decodectx.py) ...
    decode_s_per_padded_token: float = 0.0  # ... and this much more per one past the knee
    decode_padded_knee_tokens: float = 0.0
    host_parallelism: float = 0.0    # busy workers the shared host runs at full speed (1: one worker on this host; 0: not on it)
    prefill_s_per_stream: float = 0.0  # ... plus this many seconds per stream beside it
    prefill_s_beside: float = 0.0    # ... plus this many once, when any stream is beside it
    attention_s_per_cached_pair: float | None = None  # per (new, cached) token pair; None: attention_s_per_pair
    pause_rate_hz: float = 0.0       # a worker's pauses of all its streams at once, per second of decoding ...
    pause_s: float = 0.0             # ... and their mean length
    handback_s_per_turn: float = 0.0  # a finished turn's KV hand-back holds its worker busy this long ...
    handback_s_per_token: float = 0.0  # ... plus this per token of the turn
    prefill_s_new_shape: float = 0.0  # a prefill step at a token count the worker did not run lately takes this longer
    hidden_tokens: tuple[int, ...] = ()  # deciles of the tokens a request streams before its first visible text
    host_cpu_s_per_request: float = 0.0  # the host CPU outside the engines per request (0: not measured) ...
    host_cpu_s_per_step: float = 0.0     # ... per engine step of a busy worker ...
    host_cpu_s_per_token: float = 0.0    # ... and per streamed token
    request_s_per_rps: float = 0.0       # a request's path latency per request/s the mesh got in the last second

    def costs(self, admission_limit: int = 0) -> tuple[CostModel, MeshCost]:
        """The sim's cost model of this mesh (`admission_limit`: requests in flight mesh-wide, 0 = no limit)."""
        cost = CostModel(self.prefill_s_per_token, self.decode_s_per_step, self.decode_s_per_seq)
        mesh = MeshCost(
            request_overhead_s=self.request_overhead_s, request_s_per_rps=self.request_s_per_rps,
            request_busy_s=self.request_busy_s, token_overhead_s=self.token_overhead_s, hit_s_per_token=self.hit_s_per_token,
            prefill_stall=self.prefill_stall, prefill_share=self.prefill_share, noise=self.noise,
            prefill_s_per_stream=self.prefill_s_per_stream, prefill_s_beside=self.prefill_s_beside,
            prefill_s_new_shape=self.prefill_s_new_shape, hidden_tokens=self.hidden_tokens,
            attention_s_per_pair=self.attention_s_per_pair, attention_s_per_cached_pair=self.attention_s_per_cached_pair,
            host_parallelism=self.host_parallelism, host_cpu_s_per_request=self.host_cpu_s_per_request,
            host_cpu_s_per_step=self.host_cpu_s_per_step, host_cpu_s_per_token=self.host_cpu_s_per_token,
            decode_s_per_kv_token=self.decode_s_per_kv_token, decode_s_per_padded_token=self.decode_s_per_padded_token,
            decode_padded_knee_tokens=self.decode_padded_knee_tokens, pause_rate_hz=self.pause_rate_hz, pause_s=self.pause_s,
            handback_s_per_turn=self.handback_s_per_turn, handback_s_per_token=self.handback_s_per_token,
            admission_limit=admission_limit)
        return cost, mesh

    def sim_flags(self) -> list[str]:
        """`kvmesh sim` flags that reproduce this mesh."""
        flags = [
            f"--prefill-s-per-token {self.prefill_s_per_token:.3g}", f"--decode-s-per-step {self.decode_s_per_step:.3g}",
            f"--decode-s-per-seq {self.decode_s_per_seq:.3g}", f"--request-overhead-s {self.request_overhead_s:.3g}",
            f"--request-busy-s {self.request_busy_s:.3g}", f"--token-overhead-s {self.token_overhead_s:.3g}",
            f"--hit-s-per-token {self.hit_s_per_token:.3g}", f"--prefill-stall {self.prefill_stall:.3g}",
            f"--prefill-share {self.prefill_share:.3g}", f"--attention-s-per-pair {self.attention_s_per_pair:.3g}",
            f"--decode-s-per-kv-token {self.decode_s_per_kv_token:.3g}",
            f"--decode-s-per-padded-token {self.decode_s_per_padded_token:.3g}",
            f"--decode-padded-knee-tokens {self.decode_padded_knee_tokens:.0f}",
            f"--prefill-s-per-stream {self.prefill_s_per_stream:.3g} --prefill-s-beside {self.prefill_s_beside:.3g}",
            f"--handback-s-per-turn {self.handback_s_per_turn:.3g} --handback-s-per-token {self.handback_s_per_token:.3g}",
            f"--prefill-s-new-shape {self.prefill_s_new_shape:.3g}",
        ]
        if self.attention_s_per_cached_pair is not None:
            flags.append(f"--attention-s-per-cached-pair {self.attention_s_per_cached_pair:.3g}")
        if self.pause_rate_hz:
            flags.append(f"--pause-rate-hz {self.pause_rate_hz:.3g} --pause-s {self.pause_s:.3g}")
        if any(self.hidden_tokens):
            flags.append("--hidden-tokens " + ",".join(str(k) for k in self.hidden_tokens))
        if self.host_parallelism:
            flags.append(f"--host-parallelism {self.host_parallelism:.3g}")
        if self.host_cpu_s_per_request or self.host_cpu_s_per_step or self.host_cpu_s_per_token:
            flags.append(f"--host-cpu-s-per-request {self.host_cpu_s_per_request:.3g} "
                         f"--host-cpu-s-per-step {self.host_cpu_s_per_step:.3g} --host-cpu-s-per-token {self.host_cpu_s_per_token:.3g}")
        if self.request_s_per_rps:
            flags.append(f"--request-s-per-rps {self.request_s_per_rps:.3g}")
        if self.admission_limit:
            flags.append(f"--admission-limit {self.admission_limit}")
        if self.noise:
            flags.append("--ttft-noise " + ",".join(f"{x:.3g}" for x in self.noise))
        return flags


def step_s(cal: MeshCalibration, running: int) -> float:
    return cal.decode_s_per_step + (cal.decode_s_per_seq + cal.token_overhead_s) * running


def fit_prefill(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares TTFT(n) = intercept + linear · n + attention · n² / 2 over (n, TTFT) points,
    linear, attention >= 0 (nonnegative_fit; a straight line with fewer than three lengths);
    returns (intercept, linear, attention)."""
    n = np.array([p[0] for p in points], dtype=float)
    x = np.column_stack([np.ones_like(n), n, n * n / 2])
    intercept, linear, attention = nonnegative_fit(x, np.array([p[1] for p in points], dtype=float), free=1)
    return float(intercept), float(linear), float(attention)


def beside_medians(stall: list[tuple[float, float, float, float, float]]) -> dict[tuple[float, float], float]:
    """(prefill tokens, streams beside it) -> the median TTFT of the stall probe's prefills."""
    groups: dict[tuple[float, float], list[float]] = {}
    for tokens, k, _, _, ttft in stall:
        groups.setdefault((tokens, k), []).append(ttft)
    return {key: statistics.median(ttfts) for key, ttfts in sorted(groups.items())}


def fit_beside(points: list[tuple[float, float, float]], scales: list[float] | None = None) -> tuple[float, float, float]:
    """Least squares extra = beside_s + share · lone · k + per_stream_s · k over (a lone prefill's
    time, k ≥ 1 streams decoding beside it, how much longer it took beside them) points, every term
    >= 0, each point's residual over its `scales` entry (the lone request's TTFT; default 1); with one
    prefill length share and per_stream_s cannot be told apart and only share is fitted, with one
    stream count beside_s and the per-stream terms cannot and beside_s is not.
    Returns (beside_s, share, per_stream_s)."""
    # NOTE: the once-off term is what a line through the stream counts leaves at zero streams: a
    # prefill beside 1-8 streams took ~6 ms more than alone and beside 32 ~10 (tiny, 1 worker), which
    # a line through the origin fitted at 8-32 streams priced at ~2 ms beside the trace's 1-3.
    # Relative residuals: the host's noise scales with the TTFT (the long prompt's points, ~80 ms,
    # moved ±8 ms between stream counts), and unweighted they decided the once-off term alone: 0-5 ms
    # over four 1-worker calibrations, 2.9-6.9 weighted
    rows = [[1.0, w * k, k] for w, k, _ in points]
    columns = [0] if len({k for _, k, _ in points}) > 1 else []
    columns += [1, 2] if len({w for w, _, _ in points}) > 1 else [1]
    weight = np.array([1.0 / s for s in scales] if scales else [1.0] * len(points), dtype=float)
    x = np.array(rows, dtype=float).reshape(-1, 3)[:, columns] * weight[:, None]
    y = np.array([e for _, _, e in points], dtype=float) * weight
    coef = dict(zip(columns, nonnegative_fit(x, y), strict=True))
    return float(coef.get(0, 0.0)), float(coef.get(1, 0.0)), float(coef.get(2, 0.0))


def fit_new_shape(shape: list[tuple[float, float, float]]) -> float:
    """prefill_s_new_shape from the shape probe: the median over its pairs of the TTFT at a token count
    never sent less the TTFT at that count again right after (the same prompt shape, so nothing else
    differs), >= 0; 0 without pairs."""
    # NOTE: pair by pair, as the hit probe's: a burst of the host's noise lands on both of a pair
    return max(0.0, _median([cold - warm for _, cold, warm in shape]))


def fit_hits(samples: Samples, attention: float, fitted_lone: list[float]) -> tuple[float, float]:
    """(hit_s_per_token, attention_s_per_cached_pair) from the hit probe: each repeat's TTFT less its
    lone request's is c · hit + cached_pair · n · c (c cached, n new tokens), medians per shape; with
    one shape (one n) the cached pairs cost what the new ones do (`attention`)."""
    # NOTE: against the lone request sent right after each hit (same noise), else against the TTFT fit:
    # the host's noise comes in bursts, and three of five hits in one burst once made the hit cost 4x too high
    # NOTE: a shape's runs by its cached count: each run's uncached count differs (meshprobe: a count not
    # timed before), so per (cached, uncached) every group was one run, and the fit a mean that one
    # burst moved (run CE: a 47 ms pair of 14 put 6.5e-6 s a cached token; by shape, 4.2e-6)
    groups: dict[float, list[tuple[float, float]]] = {}
    for (cached, uncached, ttft), lone in zip(samples.hit, samples.hit_lone or fitted_lone, strict=True):
        if cached > 0:
            groups.setdefault(cached, []).append((uncached, ttft - lone))
    rows = [(c, statistics.median(n for n, _ in runs), statistics.median(e for _, e in runs)) for c, runs in groups.items()]
    if len({n for _, n, _ in rows}) > 1:
        coef = nonnegative_fit(np.array([[c, n * c] for c, n, _ in rows]), np.array([e for *_, e in rows]))
        return float(coef[0]), float(coef[1])
    return max(0.0, _median([(e - attention * n * c) / c for c, n, e in rows])), attention


def ttft_noise(samples: Samples) -> tuple[float, ...]:
    """The spread of a request's TTFT the sim applies (`--ttft-noise`) when the path-load probe did not
    run (with it, pathload.residual_noise replaces this): deciles of the TTFTs of the CPU-sharing
    probe's prefills beside decoding streams, each over the median of its (length, streams) point;
    the lone TTFTs (each over the median at its length) when that probe has none.

    NOTE: a loaded mesh serves its requests beside other requests' streams, and there they spread
    more than alone: run T's probes gave a 90th-percentile decile of 1.37 and 1.51 beside streams
    against 1.10 and 1.16 alone, and the real replays' TTFT p90 was 1.46-2.44x their p50 (the sim's,
    with the lone spread, 1.25-1.64x: its p90 missed by -30% at two of four points)."""
    beside = [((n, k), ttft) for n, k, _, _, ttft in samples.stall if k > 0]
    return noise_quantiles(around_median(beside or samples.ttft))


def _fit_context(long: list[tuple[float, float, float]], short_context: float,
                 itls: list[float] | None = None) -> tuple[float, float, float]:
    """(per KV token, per one past the knee, knee) of the decode step's context cost (decodectx.py) from
    the ITL probe's long streams: (streams per worker k, context x, ITL over the short streams' line
    at k). That line already holds the cost of k rows of the short streams' context x0, so a long
    point's excess is per_kv × k × (x − x0) plus the steeper part past the knee in k × x: refitted
    with the short context's share added back until it settles (each round shrinks the error by
    x0 / x, ~0.05 on the probe's points). `itls`: each point's whole ITL; an error counts relative
    to it (weights 1 / ITL).

    NOTE: fitted on absolute errors, the hinge followed the steepest points (24 ms steps) and missed
    the knee's onset: run BB's 8 streams x 1,568 read 3.5 ms and the hinge said 6.1, 16 x 1,056 read
    11.8; a trace's bursts sit there, and the sim's worker ran away at 18 req/s (real: TTFT p99 0.11-0.19 s)."""
    weights = None if itls is None else [1.0 / max(itl, 1e-6) for itl in itls]
    per_kv = per_padded = knee = 0.0
    for _ in range(64):
        before = (per_kv, per_padded, knee)
        per_kv, per_padded, knee = fit_hinge([(k * x, extra + per_kv * k * short_context) for k, x, extra in long], weights)
        if all(abs(a - b) <= 1e-13 * max(abs(a), 1e-30) for a, b in zip((per_kv, per_padded, knee), before)):
            break
    return per_kv, per_padded, knee


def fit(samples: Samples, engine_decode_s_per_seq: float | None = None) -> MeshCalibration:
    """Inverts the model above. `engine_decode_s_per_seq` (the in-process lower bound) splits the
    per-stream ITL slope into the engine's part and the mesh's per-token overhead."""
    # NOTE: the hit probe's lone requests are lone requests too (16 and 512 fresh tokens, sent after the
    # TTFT probe): more repeats of the short lengths, which set the per-request base; in runs F-I the TTFT
    # probe's short lengths alone put it 2.5-8 ms above them and above what the trace's requests saw
    lone_ttft = medians(samples.ttft + [(uncached, t) for (_, uncached, _), t in zip(samples.hit, samples.hit_lone)])
    if len(lone_ttft) < 2 or len(medians(samples.itl)) < 2:
        raise ValueError("need TTFT at two prompt lengths and ITL at two stream counts at least")
    # NOTE: the lone prefill terms as measured: slowed by the host as a lone request is (s1 below)
    intercept, per_token_m, attention_m = fit_prefill(lone_ttft)  # at new token counts: new_shape is in the intercept
    new_shape_m = fit_new_shape(samples.shape)
    workers = max(1, samples.workers)
    host = fit_host(samples.host)

    def work_m(n: float) -> float:
        return n * per_token_m + attention_m * n * n / 2

    busy = max(0.0, _median([(last - intercept + new_shape_m - work_m(n)) / (m - 1) for m, n, last in samples.burst if m > 1]))
    # NOTE: one worker on this host (host-load runs found its engine there) takes all of it: the engine's
    # torch threads are one per core (the default), and a step waits for the slowest of them
    parallel = 1.0 if samples.host else 0.0
    if workers > 1:
        parallel = _fit_parallel(samples, host, workers, intercept, busy, new_shape_m, work_m)
    mesh = MeshCost(host_parallelism=parallel, **host)
    d = _step_line(samples, mesh, workers)
    per_kv, per_padded, knee = _fit_context_terms(samples, d)
    per_seq = max(0.0, d.per_stream - per_kv * samples.itl_context)  # the short streams' line holds their context's cost
    s1 = d.lone_slowdown
    per_token, attention, new_shape = per_token_m / s1, attention_m / s1, new_shape_m / s1

    def work(n: float) -> float:
        return n * per_token + attention * n * n / 2

    hit_m, cached_pair_m = fit_hits(samples, attention_m, [intercept + work_m(uncached) for _, uncached, _ in samples.hit])
    hit, cached_pair = hit_m / s1, cached_pair_m / s1
    overhead = max(0.0, intercept - busy - s1 * (d.step(1) + new_shape))
    beside = beside_medians(samples.stall)
    lone = {n: t for (n, k), t in beside.items() if k == 0}

    def prefill(n: float) -> float:  # a lone prefill's work: as the stall probe measured it, else from the fit
        return max(0.0, (lone[n] - overhead - busy) / s1 - d.step(1) - new_shape) if n in lone else work(n)

    loaded = [(n, k, ttft) for (n, k), ttft in beside.items() if k > 0]
    extras = [(prefill(n), k / d.spread(k),
               (ttft - overhead - busy) / d.beside_slowdown(k) - d.step(k / d.spread(k) + 1) - new_shape - prefill(n))
              for n, k, ttft in loaded]
    once, share, per_stream_s = fit_beside(extras, [lone.get(n, intercept + work_m(n)) for n, _, _ in loaded])
    stalls = []
    for tokens, k, gap, itl, _ in samples.stall:
        if k > 0:
            b, w = d.spread(k), prefill(tokens)
            # NOTE: the once-off term is the prefill's latency, not its worker's time (cluster.py): the streams'
            # gap is the stall's fraction of the rest
            took = w * (1.0 + share * k / b) + per_stream_s * k / b + d.step(k / b + 1) + new_shape
            stalls.append((gap - itl) / (d.beside_slowdown(k) * took))
    handback_turn, handback_token = fit_handback(medians(samples.handback))
    admitted = samples.admitted if samples.admitted is not None and samples.admitted < samples.probe_streams else None
    engine = per_seq if engine_decode_s_per_seq is None else min(per_seq, engine_decode_s_per_seq)
    cal = MeshCalibration(
        prefill_s_per_token=per_token,
        decode_s_per_step=d.base,
        decode_s_per_seq=engine,
        request_overhead_s=overhead,
        request_busy_s=busy,
        token_overhead_s=per_seq - engine,
        hit_s_per_token=hit,
        attention_s_per_cached_pair=cached_pair,
        prefill_stall=min(1.0, max(0.0, _median(stalls))),
        prefill_share=share,
        prefill_s_per_stream=per_stream_s,
        prefill_s_beside=once,
        admission_limit=admitted,
        noise=ttft_noise(samples),
        attention_s_per_pair=attention,
        decode_s_per_kv_token=per_kv,
        decode_s_per_padded_token=per_padded,
        decode_padded_knee_tokens=knee,
        host_parallelism=parallel,
        pause_rate_hz=len(samples.pauses) / samples.pause_window_s if samples.pause_window_s else 0.0,
        pause_s=statistics.fmean(samples.pauses) if samples.pauses else 0.0,
        handback_s_per_turn=handback_turn,
        handback_s_per_token=handback_token,
        prefill_s_new_shape=new_shape,
        hidden_tokens=hidden_quantiles(samples.visible),
        **host,
    )
    return fit_path_load(samples, cal, workers) if samples.load else cal


@dataclass(frozen=True, slots=True)
class StepLine:
    """The short streams' decode step fitted on the ITL probe at one host_parallelism, unslowed by the
    shared host, and the slowdown the sim gives each probe's state on that host."""

    mesh: MeshCost      # the host terms: host_parallelism and the CPU outside the engines
    workers: int
    base: float         # decode_s_per_step
    per_stream: float   # the short streams' slope: per_seq and their context's cost

    def step(self, k: float) -> float:
        """One step of k short streams (the ITL probe's context), unslowed."""
        return self.base + self.per_stream * k

    def spread(self, k: float) -> float:
        """Busy workers when k streams run at once."""
        return _spread(k, self.workers)

    def slowdown(self, rows: list[float], arrivals: float) -> float:
        """The host's slowdown with a busy worker of each of `rows` rows (each step the short streams'
        line, without their context's cost) and `arrivals` requests in the last HOST_LOAD_WINDOW_S."""
        load = sum(step_host_s(self.mesh, r) / self.step(r) for r in rows)
        return shared_slowdown(self.mesh, len(rows), arrivals / HOST_LOAD_WINDOW_S, load)

    @property
    def lone_slowdown(self) -> float:
        """A lone request's as the sim has it when it prefills: one busy worker of one row, one arrival."""
        return self.slowdown([1.0], 1)

    def beside_slowdown(self, k: float) -> float:
        """A prefill's arriving beside k streams over spread(k) busy workers (its own worker one row
        more), k + 1 arrivals."""
        b = int(self.spread(k))
        return self.slowdown([k / b + 1] + [k / b] * (b - 1), k + 1)


def _spread(k: float, workers: int) -> float:
    return min(k, workers)


def _step_line(samples: Samples, mesh: MeshCost, workers: int) -> StepLine:
    """The short streams' line from the ITL probe: each run's step (its ITL) over the slowdown behind it
    on the shared host (`_unslowed`)."""
    points = [(k / _spread(k, workers), _unslowed(mesh, workers, k, itl)) for k, itl in medians(samples.itl)]
    base, per_stream = fit_line(points)
    if per_stream < 0:  # NOTE: a flat, noisy ITL: a step cannot get cheaper with more streams
        base, per_stream = statistics.fmean(y for _, y in points), 0.0
    return StepLine(mesh, workers, base, per_stream)


def _unslowed(mesh: MeshCost, workers: int, k: float, itl: float) -> float:
    """A step of k streams that took `itl` on the shared host, unslowed: k streams over b = min(k, W)
    busy workers of k / b rows each, k arrivals in the last second (measured_slowdown: exact for what
    the sim's host_slowdown does)."""
    b = _spread(k, workers)
    return itl / measured_slowdown(mesh, b, k / b, k / HOST_LOAD_WINDOW_S, itl)


def _fit_context_terms(samples: Samples, line: StepLine) -> tuple[float, float, float]:
    """(per KV token, per one past the knee, knee) from the ITL probe's long streams, unslowed as the
    short ones, over the short streams' line (_fit_context)."""
    # NOTE: the hinge is fitted on what the long streams took over the short ones' line at their stream
    # count; the short ones (k / b × x0 <= 16 × 64 padded tokens) are taken to be below its knee
    unslowed = [(k, x, _unslowed(line.mesh, line.workers, k, itl)) for k, x, itl in medians(samples.itl_long)
                if x > samples.itl_context]
    long = [(k / line.spread(k), x, itl - line.step(k / line.spread(k))) for k, x, itl in unslowed]
    return _fit_context(long, samples.itl_context, [itl for _, _, itl in unslowed])


def _fit_parallel(samples: Samples, host: dict[str, float], workers: int, intercept: float, busy: float, new_shape_m: float,
                  work_m: Callable[[float], float]) -> float:
    """host_parallelism P from the pair probe: W long prompts at once, one per worker, the last first token
    (W - 1) · request_busy + (s_W / s_1 - 1) × (a lone request's prefill as measured) after a lone request's,
    s_W the slowdown of W busy workers of one row (W arrivals), s_1 a lone request's (StepLine); P in
    [1, W] by bisection (without host CPU terms s_W / s_1 = W / P: P = W over the measured ratio)."""
    def ratio_gap(p: float) -> float:
        line = _step_line(samples, MeshCost(host_parallelism=p, **host), workers)
        s1 = line.lone_slowdown
        overhead = intercept - busy - s1 * line.step(1) - new_shape_m
        measured = _median([1.0 + (last - intercept - work_m(n) - (m - 1) * busy) / (intercept + work_m(n) - overhead - busy)
                            for m, n, last in samples.pair if m > 1])
        return line.slowdown([1.0] * workers, workers) / s1 - max(1.0, measured)

    if not any(m > 1 for m, _, _ in samples.pair):
        return float(workers)
    low, high = 1.0, float(workers)
    if ratio_gap(low) <= 0:
        return low
    if ratio_gap(high) >= 0:
        return high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if ratio_gap(mid) > 0 else (low, mid)
    return (low + high) / 2


def fit_path_load(samples: Samples, cal: MeshCalibration, workers: int) -> MeshCalibration:
    """`cal` with MeshCost.request_s_per_rps fitted on the path-load probe, and its TTFT noise the spread
    of that probe's requests around the sim's (pathload.residual_noise), every other term as in `cal`
    (pathload.py says why the noise comes from there); with several decode workers sharing this host,
    host_cpu_s_per_request first raised to what that probe's requests cost it (pathcpu.py).

    NOTE: one worker keeps the host-load probe's per-request term. Charged as the trace's requests'
    host_cpu_s_per_request (their CPU less what the sim's steps and tokens cost: 48 ms a request
    against the host-load probe's 4-5), it slowed the sim's 1-worker steps ~1.9x the real ones at 80%
    load (run BI: ITL p50 5.1 ms against 2.6 / 2.8): one worker's host_parallelism is 1 (below), which
    takes every CPU-second outside the engine from the engine's, while the host's other core runs
    most of it."""
    from .pathcpu import request_cpu_s  # noqa: PLC0415
    from .pathload import fit_request_s_per_rps, residual_noise  # noqa: PLC0415

    config = path_load_config(cal, workers)
    if workers > 1 and cal.host_parallelism:
        per_request = request_cpu_s(samples.load, samples.load_cpu, config)
        if per_request is not None and per_request > cal.host_cpu_s_per_request:
            cal = replace(cal, host_cpu_s_per_request=per_request)
            config = path_load_config(cal, workers)
    per_rps = fit_request_s_per_rps(samples.load, config)
    return replace(cal, request_s_per_rps=per_rps, noise=residual_noise(samples.load, config, per_rps) or cal.noise)


def path_load_config(cal: MeshCalibration, workers: int) -> SimConfig:
    """The sim of the path-load probe's mesh: `workers` decode workers of PATH_LOAD_SEQS_PER_WORKER
    sequences each, with `cal`'s terms."""
    from .cluster import SimConfig  # noqa: PLC0415 - the sim, which imports this module's neighbours

    cost, mesh = cal.costs(admission_limit=PATH_LOAD_SEQS_PER_WORKER * workers)
    return SimConfig(num_workers=workers, max_num_seqs=PATH_LOAD_SEQS_PER_WORKER, cost=cost, mesh=mesh)


def fit_host(points: list[tuple[float, ...]]) -> dict[str, float]:
    """Least squares CPU = per_request × requests + per_step × steps + per_token × tokens over the
    host-load probe's runs, every term >= 0; a 2-tuple run (requests, CPU) counts per request only."""
    if not points:
        return {}
    rows = [p if len(p) == 4 else (p[0], 0.0, 0.0, p[1]) for p in points]
    coef = nonnegative_fit(np.array([r[:3] for r in rows], dtype=float), np.array([r[3] for r in rows], dtype=float))
    return {"host_cpu_s_per_request": float(coef[0]), "host_cpu_s_per_step": float(coef[1]),
            "host_cpu_s_per_token": float(coef[2])}


def hidden_quantiles(counts: list[int], count: int = 10) -> tuple[int, ...]:
    """The `count` quantiles (nearest rank, at (i + 0.5) / count) of the visibility probe's counts of
    tokens before the first visible text: each stands for a tenth of the requests.

    NOTE: the TTFT probes time the first token itself (meshprobe.py asks them for logprobs), so no
    other term holds these tokens' steps."""
    if not counts:
        return ()
    ordered = sorted(counts)
    return tuple(ordered[min(len(ordered) - 1, int((i + 0.5) / count * len(ordered)))] for i in range(count))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
