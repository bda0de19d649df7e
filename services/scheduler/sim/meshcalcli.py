"""`kvmesh sim calibrate --url GATEWAY [--model NAME]`: the command's shell. It runs the probes
(meshprobe.py), fits the model (meshcal.py), and prints what the probes saw, the fitted terms with
their bootstrap ranges (meshspread.py), and the `kvmesh sim` flags that reproduce the mesh."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

from .calibrate import lower_bound
from .client import Target, unreachable
from .hostspeed import DRIFT_TOLERANCE, drift, pooled, speed_ratio, timed_probe
from .meshcal import MeshCalibration, Samples, beside_medians, fit
from .meshprobe import ProbeConfig
from .meshspread import bootstrap, spread_lines, term_ranges
from .meshstats import medians
from .pathload import LONE_RUN, level_medians


def probe_lines(samples: Samples) -> list[str]:
    """The probes' medians (lone TTFT by length, ITL by streams, a prefill's TTFT beside streams, a
    lone TTFT at a new token count and at it again) and the points re-probed because their repeats
    disagreed."""
    beside = beside_medians(samples.stall)
    reprobed = Counter(samples.reprobed)
    warm = dict(medians((n, t) for n, _, t in samples.shape))
    return [
        "TTFT by uncached prompt tokens: " + ", ".join(f"{n:.0f}: {t * 1e3:.1f} ms" for n, t in medians(samples.ttft)),
        "ITL by concurrent streams: " + ", ".join(f"{k:.0f}: {t * 1e3:.2f} ms" for k, t in medians(samples.itl)),
        "ITL of long-context streams (streams x mean context): " + ", ".join(
            f"{k:.0f}x{x:.0f}: {t * 1e3:.2f} ms" for k, x, t in medians(samples.itl_long)),
        "prefill TTFT beside streams: " + "; ".join(
            f"{n:.0f} tokens " + ", ".join(f"{k:.0f}: {t * 1e3:.0f} ms" for (m, k), t in beside.items() if m == n)
            for n in sorted({n for n, _ in beside})),
        "lone TTFT at a token count never sent, then at it again: " + ", ".join(
            f"{n:.0f} tokens {cold * 1e3:.1f} / {warm[n] * 1e3:.1f} ms"
            for n, cold in medians((n, t) for n, t, _ in samples.shape)),
        "path load, median TTFT (lone, then each rate level at its requests a second): " + path_load_line(samples),
        "re-probed (repeats disagreed): " + (", ".join(f"{key} +{count}" for key, count in reprobed.items()) or "none"),
    ]


def path_load_line(samples: Samples) -> str:
    lone = [s[-1] for s in samples.load if s[0] == LONE_RUN]
    levels = [f"{rate:.0f}/s {ttft * 1e3:.1f} ms" for rate, ttft in level_medians(samples.load)]
    served = sum(n for _, n, _, _ in samples.load_cpu)
    cpu = [f"host CPU outside the engines {sum(c for *_, c in samples.load_cpu) / served * 1e3:.1f} ms a request"] if served else []
    return ", ".join(([f"lone {statistics.median(lone) * 1e3:.1f} ms"] if lone else []) + levels + cpu) or "not probed"


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def describe(cal: MeshCalibration, lower_bound: dict[str, float] | None) -> list[str]:
    """Human-readable lines: the end-to-end terms, and the in-process figures labelled as a lower bound."""
    lines = [
        "# end to end, through the gateway (what `kvmesh sim` should use for this mesh):",
        f"#   prefill {cal.prefill_s_per_token:.3g} s per uncached token + {cal.attention_s_per_pair:.3g} s per "
        f"(new token, earlier new token) pair and {_or(cal.attention_s_per_cached_pair, cal.attention_s_per_pair):.3g} s "
        f"per (new, cached) pair (attention), {cal.hit_s_per_token:.3g} s per cached token",
        f"#   decode step {cal.decode_s_per_step:.3g} s + {cal.decode_s_per_seq + cal.token_overhead_s:.3g} s per stream "
        f"(of which mesh per-token overhead {cal.token_overhead_s:.3g} s) + {cal.decode_s_per_kv_token:.3g} s "
        f"per padded KV token (streams × the longest context) + {cal.decode_s_per_padded_token:.3g} s more per one "
        f"past {cal.decode_padded_knee_tokens:.0f}",
        f"#   per-request overhead {cal.request_overhead_s:.3g} s of latency, plus {cal.request_busy_s:.3g} s of work "
        "requests queue for mesh-wide (HTTP, tokenizing, routing, gRPC set-up, hand-back)",
        f"#   and {cal.request_s_per_rps * 1e3:.3g} ms more latency per request a second the mesh got in the second "
        "before (its path slowing with the traffic; the path-load probe)",
        f"#   a prefill takes {cal.prefill_share:.3g}x longer plus {cal.prefill_s_per_stream:.3g} s per stream decoding "
        f"beside it plus {cal.prefill_s_beside:.3g} s once when any does, and stalls those streams for {cal.prefill_stall:.0%} of its time (engine and RPC loop share the "
        "worker's CPU)",
        f"#   a prefill step at a token count the worker has not run lately takes {cal.prefill_s_new_shape:.3g} s longer "
        "(the engine builds its CPU kernels for the new shape), as the worker's time",
        f"#   a finished turn's KV hand-back to the store holds its worker {cal.handback_s_per_turn:.3g} s + "
        f"{cal.handback_s_per_token:.3g} s per token of the turn",
        f"#   pauses of all a worker's streams at once: {cal.pause_rate_hz:.3g} per second of decoding, "
        f"{cal.pause_s * 1e3:.0f} ms on average",
        "#   shared host: " + (f"runs {cal.host_parallelism:.3g} busy decode workers at full speed, more slow down"
                               if cal.host_parallelism else "not measured (no engine found on this host)")
        + (f"; outside the engines it spends {cal.host_cpu_s_per_request:.3g} s of CPU a request, "
           f"{cal.host_cpu_s_per_step:.3g} s an engine step of a busy worker and {cal.host_cpu_s_per_token:.3g} s a "
           "streamed token, taken from the engines' cores"
           if cal.host_cpu_s_per_request or cal.host_cpu_s_per_step or cal.host_cpu_s_per_token else ""),
        "#   admission limit: " + (f"{cal.admission_limit} requests in flight" if cal.admission_limit
                                   else "not reached by the probe (or not probed)"),
        "#   tokens streamed before a request's first visible text (deciles): "
        + (",".join(str(k) for k in cal.hidden_tokens) if cal.hidden_tokens else "not probed")
        + "; a client's TTFT is that many decode steps after the first token",
    ]
    if lower_bound:
        lines += [
            "# in-process engine, no mesh (a LOWER BOUND on the mesh's costs, not a model of it):",
            "#   " + " ".join(f"--{k.replace('_', '-')} {v:.3g}" for k, v in lower_bound.items()),
        ]
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvmesh sim calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="gateway base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name (default: the gateway's first in /v1/models)")
    p.add_argument("--api-key", default="")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="the HTTP client: raw (lean, HTTP/1.1 over asyncio streams; httpx for https) or httpx; "
                   "replay with the same one")
    p.add_argument("--lengths", default="64,256,512,1024,1536", help="uncached prompt lengths for the TTFT probe")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--extra-repeats", type=int, default=4,
                   help="more repeats, at most, of a probe point whose repeats disagree (0 = never re-probe)")
    p.add_argument("--spread-limit", type=float, default=0.15,
                   help="re-probe a point while half its repeats' interquartile range exceeds this fraction of their median")
    p.add_argument("--streams", default="1,4,8,16", help="concurrent stream counts per decode worker for the ITL probe")
    p.add_argument("--stream-tokens", type=int, default=64, help="output tokens per stream in the ITL probe")
    p.add_argument("--context-points", default=",".join(f"{k}x{n}" for k, n in ProbeConfig().context_points),
                   help="STREAMSxPROMPT_TOKENS (streams per decode worker) of the long-context ITL points, 3 or more")
    p.add_argument("--stall-streams", default="0,8,16,32",
                   help="stream counts decoding beside the CPU-sharing probe's prefill (in all, not per worker)")
    p.add_argument("--shape-tokens", default=",".join(str(n) for n in ProbeConfig().shape_tokens),
                   help="uncached prompt lengths of the new-shape probe (a token count never sent, then again); empty: skip")
    p.add_argument("--stall-lengths", default="512,1536", help="uncached prompt lengths of that prefill")
    p.add_argument("--handback-points", default=",".join(f"{k}x{n}" for k, n in ProbeConfig().handback_points),
                   help="TURNSxPROMPT_TOKENS (turns per decode worker) of the KV hand-back probe; two prompt lengths")
    p.add_argument("--settle-s", type=float, default=ProbeConfig().settle_s,
                   help="wait this long before every probe run, so the worker has handed the last run's turns back")
    p.add_argument("--workers", type=int, default=1,
                   help="decode workers behind the gateway (> 1 also probes how they share one host's cores)")
    p.add_argument("--admission-probe", type=int, default=0,
                   help="send this many streams at once to find the admission limit (0 = skip; use > the expected limit)")
    p.add_argument("--load-rates", default=",".join(f"{x:g}" for x in ProbeConfig().load_rates),
                   help="the path-load probe's rates, as fractions of 1 / a lone request's TTFT (empty: skip the probe)")
    p.add_argument("--load-seconds", type=float, default=ProbeConfig().load_seconds,
                   help="how long each path-load run sends requests at each rate, in blocks that step between the rates")
    p.add_argument("--load-block-s", type=float, default=ProbeConfig().load_block_s,
                   help="the path-load probe's rate steps to another of its rates this often")
    p.add_argument("--engine-model", default="",
                   help="also measure the in-process engine on this model (tiny or a directory): a lower bound")
    return p


def _points(text: str) -> tuple[tuple[int, int], ...]:
    """"16x1024,24x1536" -> ((16, 1024), (24, 1536))."""
    return tuple((int(k), int(n)) for k, n in (point.split("x") for point in text.split(",") if point))


def calibrate_main(argv: list[str] | None = None) -> int:
    """Entry point for `kvmesh sim calibrate`."""
    args = build_parser().parse_args(argv)
    config = ProbeConfig(
        lengths=tuple(int(x) for x in args.lengths.split(",")), repeats=args.repeats,
        streams=tuple(int(x) for x in args.streams.split(",")), stream_tokens=args.stream_tokens,
        admission_probe=args.admission_probe, workers=args.workers, extra_repeats=args.extra_repeats,
        spread_limit=args.spread_limit,
        context_points=_points(args.context_points),
        stall_streams=tuple(int(x) for x in args.stall_streams.split(",")),
        stall_lengths=tuple(int(x) for x in args.stall_lengths.split(",")), settle_s=args.settle_s,
        handback_points=_points(args.handback_points),
        shape_tokens=tuple(int(x) for x in args.shape_tokens.split(",") if x),
        load_rates=tuple(float(x) for x in args.load_rates.split(",") if x), load_seconds=args.load_seconds,
        load_block_s=args.load_block_s,
    )
    target = Target(args.url.rstrip("/"), args.model, args.api_key, client=args.client)
    t0 = time.perf_counter()
    try:
        speeds, samples = timed_probe(target, config)
    except Exception as exc:  # noqa: BLE001 - only the gateway's failures are turned into a message
        if not (unreachable(exc) or isinstance(exc, RuntimeError)):
            raise
        raise SystemExit(f"kvmesh sim calibrate: {target.url}: {exc}") from None
    lower = lower_bound(args.engine_model) if args.engine_model else None
    cal = fit(samples, lower["decode_s_per_seq"] if lower else None)
    print(f"# kvmesh sim calibrate: {target.url}, probes took {time.perf_counter() - t0:.0f} s "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for line in probe_lines(samples):
        print(f"# {line}")
    for line in describe(cal, lower):
        print(line)
    ranges = term_ranges(bootstrap(samples, engine_decode_s_per_seq=lower["decode_s_per_seq"] if lower else None,
                                   fitted=cal))
    print("# fit uncertainty, each term's 10th..90th percentile over refits of resampled probe repeats (meshspread.py):")
    for line in spread_lines(cal, ranges):
        print(f"#   {line}")
    reference = pooled(speeds)
    print(f"# host speed at the probes' start: {speeds[0].describe()}; at their end: {speeds[1].describe()} "
          f"({speed_ratio(speeds[1], speeds[0]):.2f}x); to match a later replay's sim to the host's speed then: "
          f"kvmesh sim replay ... --speed-reference {reference.ttft_s:.4g},{reference.itl_s:.4g}")
    moved = drift(speeds[0], speeds[1])
    if moved > 1.0 + DRIFT_TOLERANCE:
        print(f"# WARNING: the host's speed moved {moved:.2f}x while the probes ran: they mix two "
              "speeds and the fit is unreliable; calibrate again on a steadier host")
    print("kvmesh sim " + " ".join(cal.sim_flags()))
    return 0

