"""The request path under traffic: fits MeshCost.request_s_per_rps on the path-load probe.

The probe (meshprobe.py) sends requests like a multi-turn trace's (a cached prefix every request
shares, then fresh tokens) at Poisson arrivals whose rate steps between three levels every
`load_block_s` (the levels in a new random order each cycle), and times each one's first token.
Interleaved, the levels share the host's drift: run after run at one rate each, the medians of
one rate moved ±5 ms between runs minutes apart, which pinned the term to ±0.15 ms per req/s. The
sim is run on those same requests (their arrival times and lengths, the prefix cached by a request
before them) with every other term as fitted; what it lacks is the path outside the engine
slowing with the traffic around it, which the other probes (one request, or one prefill beside
steady streams, at a time) never load. The term is the `request_s_per_rps` at which the sim's
median first token of each (run, level) meets the probe's, in least squares over them (each
group's own requests a second set how much the term moves its median), with a constant offset
fitted beside it (path_offset): the host's speed drifts during a calibration, and a constant would
otherwise read as a slope through the origin. Newton's method on a function that is linear in the
term but for the sim's own knock-on effects (a later first token ends its turn later), so a few
steps settle it, and timings the sim made with a known term, shifted by any constant, give that
term back.

Until stop 47 the offset was the probe's lone requests' median TTFT (sent one at a time just before
the runs, run LONE_RUN) less the sim's for them. On runs BU (2 workers) and BV (1 worker) that
anchor read 6.3 and 7.0 ms, while the probe's lowest level (~10 req/s) met the sim's medians with
no offset at all: a request alone on an idle host is slower than one among others (likely the loops
waking from idle), which is not the host's speed. It took the whole rise with the rate out and fitted a
term of 0; the free intercept fits 0.20 ms per req/s on BU's saved probe and 0.34 on BV's.
Re-simulated on those probes (`bench/simwhatif.py`, noise refitted around the same offset), BU's
TTFT p50 / p90 at 50% load went -13% / -12% → +2% / -8% of the real mesh's, at 80% -32% / -42% →
-12% / -35%, capacity +14% → +9%; BV's 50% went -16% / -5% → +6% / +2%, its 80% -14% / -6% → +21% /
+13% (that run's real medians at 18.2 req/s sat below its 11.4 req/s ones), capacity +23% (both).
The lone median is still printed by the calibration (meshcalcli.path_load_line).

Why a shared prefix: fresh 256-token prompts at 10-33 req/s kept a flat median TTFT on a 1-worker
mesh (14-15 ms, the term fitted 0.06 ms per req/s), while 768 cached + 200 fresh tokens went
15.4, 18.7, 22.7, 29.9 ms at 8, 16, 24, 32 req/s: the trace's requests carry a long body, its
block hashes through the gateway, the scheduler and the KV events, and a prefix hit.

The probe's requests also give the sim its TTFT spread (`--ttft-noise`, residual_noise): each one's
TTFT over the sim's for it with the term fitted and no noise, over the median of its (run, level),
as deciles. That is the spread the model lacks on a loaded path: bursts of other requests' work on
the gateway, the workers' RPC loops and the shared cores, which a deterministic sim has no tail for.
Before, the noise came from the CPU-sharing probe's prefills beside steady streams (deciles
0.81-1.30 in run BQ); the path-load probe's residuals spread 0.54-2.00 (BQ, 2 workers), 0.62-1.83
(BO) and 0.65-1.64 (BP, 1 worker). On those runs' saved probes (`bench/simwhatif.py --noise
beside|fitted`), the sim's TTFT p90 at 50% / 80% load went 39 / 45 → 47 / 56 ms against real
55-57 / 62-69 (BQ), 50 / 65 → 58 / 75 against 49-51 / 73-103 (BO) and 29 / 34 → 32 / 36 against
33-35 / 39-46 (BP), its p50 within 2 ms of before and its capacity unchanged (the noise stretches
a request's latency, not its worker's time). `bench/reqpath.py` shows where that tail sits on a real 2-worker mesh: the
slowest tenth of requests spent +10-13 ms in the prefill step and +5-11 ms from the worker's first
token to the client's first chunk over the rest.

A sample is (run, rate level, arrival s within the run, cached prefix tokens, fresh tokens, output
tokens, TTFT s) per request.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from .calibrate import fit_line
from .cluster import Cluster, SimConfig
from .meshcost import HOST_LOAD_WINDOW_S
from .meshstats import around_median, noise_quantiles
from .report import quantile
from .trace import TraceRequest

MAX_STEPS = 8
FOLLOWS = 2.0  # residual_noise takes a run whose sim TTFT p90 stays within this factor of the probe's at every level
LONE_RUN = -1.0  # the run index of the probe's lone requests
PRIME_LEAD_S = 2.0  # the sim's request that caches the shared prefix comes this long before a run
PREFIX_IDS = 1 << 40  # the shared prefixes' hash ids start here (every other block's are below) ...
PREFIX_SPAN = 1 << 20  # ... this many apart
PRIME = "prime"

Request = tuple[float, int, int, int, int, float]  # (arrival s, prefix tokens, fresh tokens, output tokens, prefix index, TTFT s)


def runs_of(samples: Sequence[Sequence[float]]) -> tuple[list[list[Request]], list[list[int]]]:
    """Each run's requests in arrival order, and each one's rate level; the lone requests left out."""
    runs: dict[int, list[tuple[Request, int]]] = {}
    for sample in samples:
        run, level, arrival, prefix, fresh, output, *index, ttft = sample  # NOTE: no index: an older probe's one prefix
        if run != LONE_RUN:
            request = (float(arrival), int(prefix), int(fresh), int(output), int(index[0]) if index else 0, float(ttft))
            runs.setdefault(int(run), []).append((request, int(level)))
    ordered = [sorted(runs[k]) for k in run_keys(samples)]
    return [[r for r, _ in run] for run in ordered], [[lv for _, lv in run] for run in ordered]


def run_keys(samples: Sequence[Sequence[float]]) -> list[int]:
    """The runs' indices in runs_of's order (the lone requests left out)."""
    return sorted({int(s[0]) for s in samples if s[0] != LONE_RUN})


def trace_of(run: int, requests: Sequence[Request], block_tokens: int) -> list[TraceRequest]:
    """The run's requests as a trace, PRIME_LEAD_S later, after a request for each of their shared
    prefixes that caches it (`PRIME`, all at once, as the probe sends them): each prompt is its
    prefix's blocks, then blocks of its own."""
    if not requests:
        return []
    prefix = requests[0][1]
    indices = sorted({r[4] for r in requests})
    shared = {k: tuple(range(PREFIX_IDS + k * PREFIX_SPAN, PREFIX_IDS + k * PREFIX_SPAN + prefix // block_tokens))
              for k in indices}
    out = [TraceRequest(0.0, f"load{run}-{k or ''}{PRIME}", "", prefix + block_tokens, 1,
                        (*shared[k], PREFIX_IDS - 1 - run * PREFIX_SPAN - k)) for k in indices]
    for i, (arrival, prefix, fresh, output, k, _) in enumerate(requests):
        first = (run * 100_000 + i) * 1000
        own = tuple(range(first, first + -(-fresh // block_tokens)))
        out.append(TraceRequest(PRIME_LEAD_S + arrival, f"load{run}-{i}", "", prefix + fresh, output, shared[k] + own))
    return out


def stepped_arrivals(rates: Sequence[float], cycles: int, block_s: float, rng: random.Random) -> list[tuple[float, int]]:
    """Poisson arrivals whose rate steps between `rates` every `block_s`, `cycles` times through them (a
    new random order each cycle): (arrival s, the index of its rate), in order."""
    arrivals = []
    for cycle in range(cycles):
        for k, level in enumerate(rng.sample(range(len(rates)), len(rates))):
            start = (cycle * len(rates) + k) * block_s
            t = start + rng.expovariate(rates[level])
            while t < start + block_s:
                arrivals.append((t, level))
                t += rng.expovariate(rates[level])
    return arrivals


def others(arrivals: Sequence[float]) -> list[int]:
    """For each arrival (in order), how many came in the HOST_LOAD_WINDOW_S before it."""
    return [sum(1 for b in arrivals[:i] if a - b <= HOST_LOAD_WINDOW_S) for i, a in enumerate(arrivals)]


def others_rate(arrivals: Sequence[float]) -> float:
    """The mean over requests of the requests a second that arrived in the HOST_LOAD_WINDOW_S before each."""
    return statistics.fmean(others(arrivals)) / HOST_LOAD_WINDOW_S if arrivals else 0.0


def level_medians(samples: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """Each rate level's requests a second before its requests (mean) and their median TTFT, over every run."""
    runs, levels = runs_of(samples)
    by_level: dict[int, list[tuple[int, float]]] = {}
    for run, run_levels in zip(runs, levels, strict=True):
        for request, count, level in zip(run, others([r[0] for r in run]), run_levels, strict=True):
            by_level.setdefault(level, []).append((count, request[-1]))
    return [(statistics.fmean(c for c, _ in v) / HOST_LOAD_WINDOW_S, statistics.median(t for _, t in v))
            for _, v in sorted(by_level.items())]


def sim_ttfts(config: SimConfig, trace: list[TraceRequest], per_rps: float, policy: str,
              refused_s: float | None = None) -> dict[str, float]:
    """The sim's TTFT (to the first token) of each request of `trace` at `per_rps`, by id, its prime left
    out. A request the sim refused (429, or 504 past its admission deadline) counts as `refused_s` (no
    sooner than it failed) when that is given, else is left out."""
    mesh = replace(config.mesh, request_s_per_rps=per_rps)
    results = Cluster(policy, replace(config, mesh=mesh)).run(trace)
    return {r.request.request_id: r.ttft_s if r.status == 200 else max(r.ttft_s, refused_s)
            for r in results if (r.status == 200 or refused_s is not None) and not r.request.request_id.endswith(PRIME)}


def group_medians(config: SimConfig, traces: list[list[TraceRequest]], groups: list[list[tuple[int, int]]],
                  per_rps: float, policy: str) -> list[float]:
    """The sim's median TTFT of each group; a group lists (run, index in that run's requests).

    NOTE: a request the sim refused counts as waiting its whole admission deadline: a term large enough
    to overload the sim at a probe's rate (run BS, 1 worker, a Newton step of the fit) is too large,
    and its refusals left out would have crashed the fit or read as fast first tokens."""
    ttfts = [sim_ttfts(config, trace, per_rps, policy, config.mesh.admission_timeout_s) for trace in traces]
    return [statistics.median(ttfts[run][f"load{run}-{i}"] for run, i in group) for group in groups]


def fit_request_s_per_rps(samples: Sequence[Sequence[float]], config: SimConfig, policy: str = "kv_aware") -> float:
    """The term (>= 0) at which the sim's median TTFT of each (run, rate level) follows the probe's
    over the rate, less a constant (the host's speed this calibration, path_offset); 0 without samples."""
    fit = level_fit(samples, config, policy)
    if fit is None:
        return 0.0
    rates, real, medians = fit
    per_rps = 0.0
    base = medians(per_rps)
    for _ in range(MAX_STEPS):
        # NOTE: d(median)/d(per_rps) is about each group's rate (its median request's own rate); the sim's
        # knock-on effects bend it a little, which the next step corrects
        step, _ = residual_line(rates, real, base)
        nxt = max(0.0, per_rps + step)
        if abs(nxt - per_rps) <= 1e-9 or (nxt == 0.0 and per_rps == 0.0):
            return nxt
        per_rps, base = nxt, medians(nxt)
    return per_rps


def path_offset(samples: Sequence[Sequence[float]], config: SimConfig, per_rps: float, policy: str = "kv_aware") -> float:
    """The constant by which the probe's median TTFTs sit above the sim's at `per_rps`, the intercept of
    their difference over the rate (the host's speed this calibration, not a slope); 0 without samples."""
    fit = level_fit(samples, config, policy)
    if fit is None:
        return 0.0
    rates, real, medians = fit
    return residual_line(rates, real, medians(per_rps))[1]


def level_fit(samples: Sequence[Sequence[float]], config: SimConfig, policy: str
              ) -> tuple[list[float], list[float], Callable[[float], list[float]]] | None:
    """Each (run, rate level)'s rate (requests a second before its requests, mean), its median TTFT, and
    the sim's medians at a term; None without a rate."""
    runs, levels = runs_of(samples)
    keys = sorted({(run, level) for run, lv in enumerate(levels) for level in lv})
    groups = [[(run, i) for i, lv in enumerate(levels[run]) if lv == level] for run, level in keys]
    counts = [others([a for a, *_ in r]) for r in runs]
    rates = [statistics.fmean(counts[run][i] for run, i in g) / HOST_LOAD_WINDOW_S for g in groups]
    if not any(rates):
        return None
    real = [statistics.median(runs[run][i][-1] for run, i in g) for g in groups]
    traces = [trace_of(run, r, config.cost.block_size) for run, r in enumerate(runs)]
    return rates, real, lambda per_rps: group_medians(config, traces, groups, per_rps, policy)


def residual_line(rates: Sequence[float], real: Sequence[float], sim: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of real - sim over the rate in least squares; through the origin where the
    rates do not differ (one level: no intercept to tell from a slope)."""
    residuals = [y - s for y, s in zip(real, sim, strict=True)]
    if statistics.pvariance(rates) <= 1e-12 * statistics.fmean(x * x for x in rates):
        return sum(x * r for x, r in zip(rates, residuals, strict=True)) / sum(x * x for x in rates), 0.0
    intercept, slope = fit_line(list(zip(rates, residuals, strict=True)))
    return slope, intercept


def residual_noise(samples: Sequence[Sequence[float]], config: SimConfig, per_rps: float,
                   policy: str = "kv_aware") -> tuple[float, ...]:
    """Deciles (meshstats.noise_quantiles) of each probe request's TTFT (less path_offset) over the
    sim's for it at `per_rps` with no noise, each over the median of its (run, rate level): the spread
    the sim lacks on a loaded path (module docstring); () without runs the sim follows.

    NOTE: only runs the sim follows count: at each level the sim's 90th percentile TTFT within FOLLOWS
    of the probe's (a request it refused counts as infinite, and adds no ratio). In run BS (1 worker, a fast host, so the probe's top
    level reached 31.6 req/s) the sim ran away on two runs of five (its median TTFT 1.6-1.8 s where the
    mesh's was 17-32 ms) and tipped into it on a third (p90 0.34 s against 26 ms); their ratios, the
    sim's runaway and not the host's noise, made deciles of 0.09-9.7."""
    runs, levels = runs_of(samples)
    quiet = without_noise(config)
    offset = path_offset(samples, quiet, per_rps, policy)  # the ratios are over the quiet sim's, so is this
    ratios: list[tuple[tuple[int, int], float]] = []
    for run, (requests, run_levels) in enumerate(zip(runs, levels, strict=True)):
        sim = sim_ttfts(quiet, trace_of(run, requests, config.cost.block_size), per_rps, policy, math.inf)
        pairs = [((run, level), request[-1] - offset, sim[f"load{run}-{i}"])
                 for i, (request, level) in enumerate(zip(requests, run_levels, strict=True))]
        if followed(pairs):
            ratios += [(key, real / expected) for key, real, expected in pairs if 0 < expected < math.inf]
    return noise_quantiles(around_median(ratios))


def without_noise(config: SimConfig) -> SimConfig:
    """`config` with no TTFT noise: the sim's expected timings."""
    return replace(config, mesh=replace(config.mesh, noise=()))


def followed(pairs: Sequence[tuple[tuple[int, int], float, float]]) -> bool:
    """Whether the sim follows one probe run: (group, real TTFT, sim TTFT) per request, the sim's 90th
    percentile within FOLLOWS times the real one's in every group (a refused request is infinite)."""
    groups: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
    for key, real, expected in pairs:
        groups.setdefault(key, ([], []))[0].append(real)
        groups[key][1].append(expected)
    return all(quantile(sim, 0.9) <= FOLLOWS * quantile(real, 0.9) for real, sim in groups.values())
