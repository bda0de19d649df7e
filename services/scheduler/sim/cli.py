"""`kvmesh sim`: replays a trace against N simulated workers with each routing policy.

`kvmesh sim calibrate --url GATEWAY` measures a running mesh for the cost flags (meshprobe.py);
`kvmesh sim replay TRACE --url GATEWAY` sends a trace to it and prints the same table (replay.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import replace

from ..pd import PdConfig
from ..policy import POLICY_NAMES, CostModel, PolicyConfig
from .cluster import SimConfig
from .hostspeed import scaled
from .meshcost import MeshCost
from .scaleup import scale_up_main
from .report import DETAIL_HEADER, HEADER, RunSummary, capacity, detail_row, row, simulate
from .trace import (
    SyntheticConfig, TraceRequest, mean_rate, read_jsonl, scale_rate, synthetic, without_output_blocks, write_jsonl,
)

SUBCOMMANDS = {"calibrate": ("meshcalcli", "calibrate_main"), "replay": ("replay", "replay_main")}


def build_parser() -> argparse.ArgumentParser:
    cost, pd, pol = CostModel(), PdConfig(), PolicyConfig()
    p = argparse.ArgumentParser(prog="kvmesh sim", description=__doc__)
    p.add_argument("--workers", default="8,32,128",
                   help="decode worker counts, comma-separated (the capacity search at 128 takes tens of minutes)")
    p.add_argument("--prefill-workers", type=float, default=0.0, help="prefill workers per decode worker (0 = none)")
    p.add_argument("--policy", default="all", help=f"one of {', '.join(POLICY_NAMES)}, comma-separated, or all")
    p.add_argument("--trace", default="", help="JSONL trace to replay (default: synthetic multi-turn sessions)")
    p.add_argument("--write-trace", default="", help="write the synthetic trace (at --rate × workers) to this file and exit")
    p.add_argument("--rate", type=float, default=0.0,
                   help="requests/s per worker for the table row (0 = 70%% of round_robin's capacity)")
    p.add_argument("--slo-ttft-s", type=float, default=0.5, help="TTFT p99 SLO for the capacity column")
    p.add_argument("--no-capacity", action="store_true", help="skip the capacity search")
    p.add_argument("--search-steps", type=int, default=4, help="bisection steps of the capacity search")
    p.add_argument("--duration-s", type=float, default=30.0, help="synthetic: sessions start during this long")
    p.add_argument("--warmup-s", type=float, default=10.0, help="synthetic: figures start after this")
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of system-prompt popularity")
    p.add_argument("--arrival", choices=("poisson", "bursty"), default="poisson")
    p.add_argument("--turns", type=float, default=4.0, help="mean turns per session")
    p.add_argument("--think-time-s", type=float, default=2.0, help="mean gap between a session's turns")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-blocks", type=int, default=8192, help="per-worker prefix cache, blocks")
    p.add_argument("--event-delay-s", type=float, default=0.05)
    p.add_argument("--routers", default="1",
                   help="scheduler replicas, comma-separated (e.g. 1,2,4): each sees KV events with its own delay")
    p.add_argument("--peer-delay-s", type=float, default=0.005, help="replicas: a routing decision reaching the peers")
    p.add_argument("--sticky-ttl-s", type=float, default=0.0, help="sticky sessions (0 = off, to compare policies)")
    p.add_argument("--prefill-s-per-token", type=float, default=cost.prefill_s_per_token)
    p.add_argument("--decode-s-per-step", type=float, default=cost.decode_s_per_step)
    p.add_argument("--decode-s-per-seq", type=float, default=cost.decode_s_per_seq)
    mesh = MeshCost()
    p.add_argument("--request-overhead-s", type=float, default=mesh.request_overhead_s,
                   help="mesh: added to every TTFT (`kvmesh sim calibrate` measures it)")
    p.add_argument("--request-s-per-rps", type=float, default=mesh.request_s_per_rps,
                   help="mesh: and this much more per request/s that reached the mesh in the last second (its path slows "
                   "with the traffic)")
    p.add_argument("--request-busy-s", type=float, default=mesh.request_busy_s,
                   help="mesh: per-request work outside the engine that requests queue for, mesh-wide")
    p.add_argument("--prefill-share", type=float, default=mesh.prefill_share,
                   help="mesh: a prefill takes (1 + this x other running streams) times as long")
    p.add_argument("--prefill-s-per-stream", type=float, default=mesh.prefill_s_per_stream,
                   help="mesh: and this many seconds longer per other running stream")
    p.add_argument("--prefill-s-beside", type=float, default=mesh.prefill_s_beside,
                   help="mesh: and this many seconds longer, once, when any other stream runs on its worker")
    p.add_argument("--prefill-s-new-shape", type=float, default=mesh.prefill_s_new_shape,
                   help="mesh: a prefill step at a token count its worker did not run lately takes this much longer "
                   "(CPU kernels are built per shape), as worker time")
    p.add_argument("--kernel-cache-counts", type=int, default=SimConfig().kernel_cache_counts,
                   help="the last N distinct prefill step token counts a worker's kernels stay cached for")
    p.add_argument("--cold-kernel-caches", action="store_true",
                   help="start every worker's kernel-count cache empty (default: as a first pass of the same trace "
                   "left it, a mesh in steady state on this workload)")
    p.add_argument("--hidden-tokens", type=_counts, default=(), help="mesh: comma-separated counts of tokens a request streams "
                   "before its first visible text, one per request by its id (`kvmesh sim calibrate` measures them)")
    p.add_argument("--ttft-noise", default="", help="mesh: comma-separated factors on prefill time and overhead, "
                   "one per request by its id (the host's noise, from `kvmesh sim calibrate`)")
    p.add_argument("--host-parallelism", type=float, default=mesh.host_parallelism,
                   help="mesh: all decode workers share one host (`kvmesh up` on one machine) that runs this many "
                   "busy ones at full speed (0 = a host each)")
    p.add_argument("--host-cpu-s-per-request", type=float, default=mesh.host_cpu_s_per_request,
                   help="mesh: on that shared host, the CPU a request costs outside the engines (gateway, scheduler, "
                   "RPC loops, KV store, a local client), taken from the busy workers' cores at the recent request rate")
    p.add_argument("--host-cpu-s-per-step", type=float, default=mesh.host_cpu_s_per_step,
                   help="mesh: ... and per engine step of a busy decode worker (its step frame and the wake-ups it causes)")
    p.add_argument("--host-cpu-s-per-token", type=float, default=mesh.host_cpu_s_per_token,
                   help="mesh: ... and per streamed token (a message each, below --stream-interval-from rows)")
    p.add_argument("--stream-interval", type=int, default=mesh.stream_interval,
                   help="mesh: the decode workers' stream_interval (tokens a message under load)")
    p.add_argument("--stream-interval-from", type=int, default=mesh.stream_interval_from,
                   help="mesh: ... from this many running sequences on a worker (their stream_interval_from)")
    p.add_argument("--decode-s-per-context-token", type=float, default=mesh.decode_s_per_context_token,
                   help="mesh: added to a decode step per token of each running sequence's context (the old, linear model)")
    p.add_argument("--decode-s-per-kv-token", type=float, default=mesh.decode_s_per_kv_token,
                   help="mesh: added to a decode step per padded KV token (running x the longest context)")
    p.add_argument("--decode-s-per-padded-token", type=float, default=mesh.decode_s_per_padded_token,
                   help="mesh: added to a decode step per padded KV token past the knee, on top")
    p.add_argument("--decode-padded-knee-tokens", type=float, default=mesh.decode_padded_knee_tokens,
                   help="mesh: where the decode step's cost per padded KV token steepens (`kvmesh sim calibrate` fits all three)")
    p.add_argument("--pause-rate-hz", type=float, default=mesh.pause_rate_hz,
                   help="mesh: a busy worker pauses all its work this many times a second (Poisson) ...")
    p.add_argument("--pause-s", type=float, default=mesh.pause_s, help="mesh: ... for this long each time")
    p.add_argument("--attention-s-per-pair", type=float, default=mesh.attention_s_per_pair,
                   help="mesh: prefill's quadratic part, per (new prompt token, earlier token) pair")
    p.add_argument("--attention-s-per-cached-pair", type=float, default=mesh.attention_s_per_cached_pair,
                   help="mesh: the same per (new token, cached token) pair (default: --attention-s-per-pair)")
    p.add_argument("--token-overhead-s", type=float, default=mesh.token_overhead_s,
                   help="mesh: added to a decode step per running sequence")
    p.add_argument("--hit-s-per-token", type=float, default=mesh.hit_s_per_token, help="mesh: cost of a cached prompt token")
    p.add_argument("--handback-s-per-turn", type=float, default=mesh.handback_s_per_turn,
                   help="mesh: a finished turn's KV hand-back to the store holds its decode worker busy this long ...")
    p.add_argument("--handback-s-per-token", type=float, default=mesh.handback_s_per_token,
                   help="mesh: ... plus this long per token of the turn (prompt + output)")
    p.add_argument("--prefill-stall", type=float, default=mesh.prefill_stall,
                   help="mesh: fraction of a local prefill during which the worker's streams stop (0..1)")
    p.add_argument("--admission-limit", type=int, default=mesh.admission_limit,
                   help="mesh: requests in flight mesh-wide before admission queues them (0 = only max_num_seqs per worker)")
    p.add_argument("--admission-timeout-s", type=float, default=mesh.admission_timeout_s,
                   help="mesh: a request queued in admission this long fails with 504")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="every time cost above x this: the host this much slower than when calibrated "
                   "(`kvmesh sim replay --speed-reference` prints it)")
    p.add_argument("--no-output-blocks", action="store_true",
                   help="ignore the trace's output_hash_ids (as a replay on a real mesh must)")
    p.add_argument("--local-prefill-max-tokens", type=int, default=pd.local_prefill_max_tokens)
    p.add_argument("--kv-decode-weight", type=float, default=pol.kv_decode_weight)
    p.add_argument("--kv-overlap-decay-requests", type=float, default=pol.kv_overlap_decay_requests)
    p.add_argument("--kv-temperature", type=float, default=pol.kv_temperature)
    p.add_argument("--kv-queue-weight", type=float, default=pol.kv_queue_weight)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale-up", type=int, default=0,
                   help="N decode workers join mid-trace; compares KV pre-warming off and on (see sim/scaleup.py)")
    p.add_argument("--join-at-s", type=float, default=0.0, help="scale-up: when they join (0 = at --warmup-s)")
    p.add_argument("--window-s", type=float, default=10.0, help="scale-up: mesh TTFT is measured this long after the join")
    p.add_argument("--prewarm-budget-blocks", type=int, default=256, help="scale-up: blocks each joiner is pre-warmed with")
    return p


def _sim_config(args: argparse.Namespace, n: int, routers: int = 1) -> SimConfig:
    config = _unscaled_config(args, n, routers)
    if args.time_scale == 1.0:
        return config
    cost, mesh = scaled(config.cost, config.mesh, args.time_scale)
    return replace(config, cost=cost, mesh=mesh)


def _unscaled_config(args: argparse.Namespace, n: int, routers: int) -> SimConfig:
    return SimConfig(
        num_workers=n,
        routers=routers,
        peer_delay_s=args.peer_delay_s,
        num_prefill_workers=round(n * args.prefill_workers),
        max_num_seqs=args.max_num_seqs,
        kv_blocks=args.kv_blocks,
        event_delay_s=args.event_delay_s,
        sticky_ttl_s=args.sticky_ttl_s,
        kernel_cache_counts=args.kernel_cache_counts,
        warm_kernel_caches=not args.cold_kernel_caches,
        cost=CostModel(args.prefill_s_per_token, args.decode_s_per_step, args.decode_s_per_seq, args.block_size),
        pd=PdConfig(local_prefill_max_tokens=args.local_prefill_max_tokens),
        mesh=MeshCost(
            request_overhead_s=args.request_overhead_s, request_s_per_rps=args.request_s_per_rps,
            request_busy_s=args.request_busy_s, token_overhead_s=args.token_overhead_s, hit_s_per_token=args.hit_s_per_token,
            handback_s_per_turn=args.handback_s_per_turn, handback_s_per_token=args.handback_s_per_token,
            prefill_stall=args.prefill_stall, prefill_share=args.prefill_share,
            prefill_s_per_stream=args.prefill_s_per_stream, prefill_s_beside=args.prefill_s_beside,
            prefill_s_new_shape=args.prefill_s_new_shape,
            host_parallelism=args.host_parallelism, host_cpu_s_per_request=args.host_cpu_s_per_request,
            host_cpu_s_per_step=args.host_cpu_s_per_step, host_cpu_s_per_token=args.host_cpu_s_per_token,
            stream_interval=args.stream_interval, stream_interval_from=args.stream_interval_from,
            attention_s_per_pair=args.attention_s_per_pair,
            attention_s_per_cached_pair=args.attention_s_per_cached_pair,
            decode_s_per_context_token=args.decode_s_per_context_token,
            pause_rate_hz=args.pause_rate_hz, pause_s=args.pause_s,
            decode_s_per_kv_token=args.decode_s_per_kv_token, decode_s_per_padded_token=args.decode_s_per_padded_token,
            decode_padded_knee_tokens=args.decode_padded_knee_tokens,
            noise=tuple(float(x) for x in args.ttft_noise.split(",") if x),
            hidden_tokens=args.hidden_tokens,
            admission_limit=args.admission_limit, admission_timeout_s=args.admission_timeout_s,
        ),
        policy=PolicyConfig(
            kv_decode_weight=args.kv_decode_weight, kv_overlap_decay_requests=args.kv_overlap_decay_requests,
            kv_temperature=args.kv_temperature, kv_queue_weight=args.kv_queue_weight, dualmap_ttft_slo_s=args.slo_ttft_s, seed=args.seed,
        ),
    )


def _trace_source(args: argparse.Namespace) -> Callable[[float], tuple[list[TraceRequest], tuple[float, float] | None]]:
    """rate (requests/s) → (trace, measurement window)."""
    if args.trace:
        base = read_jsonl(args.trace)
        if not base:
            raise SystemExit(f"kvmesh sim: {args.trace} holds no requests")
        base = without_output_blocks(base) if args.no_output_blocks else base
        return lambda rate: (scale_rate(base, rate / max(mean_rate(base), 1e-9)), None)
    synth = SyntheticConfig(
        duration_s=args.duration_s, num_system_prompts=args.system_prompts, skew=args.skew, turns_mean=args.turns,
        think_time_s=args.think_time_s, arrival=args.arrival, block_size=args.block_size, seed=args.seed,
    )
    strip = without_output_blocks if args.no_output_blocks else list
    return lambda rate: (strip(synthetic(synth, rate)), (args.warmup_s, args.duration_s))


def _counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of token counts (>= 0)."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if any(k < 0 for k in counts):
        raise argparse.ArgumentTypeError("token counts must be >= 0")
    return counts


def sim_main(argv: list[str] | None = None) -> int:
    """Entry point for `kvmesh sim`: one table row per (worker count, policy)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[argv[0]]
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(argv[1:])
    args = build_parser().parse_args(argv)
    policies = POLICY_NAMES if args.policy == "all" else tuple(args.policy.split(","))
    for name in policies:
        if name not in POLICY_NAMES:
            raise SystemExit(f"kvmesh sim: unknown policy {name!r} (expected one of {', '.join(POLICY_NAMES)})")
    if args.time_scale <= 0:
        raise SystemExit("kvmesh sim: --time-scale must be > 0")
    if args.warmup_s >= args.duration_s and not (args.trace or args.write_trace):
        raise SystemExit("kvmesh sim: --warmup-s must be below --duration-s")
    trace_at = _trace_source(args)
    if args.write_trace:
        write_jsonl(trace_at(args.rate or 1.0)[0], args.write_trace)
        print(f"wrote {args.write_trace}")
        return 0
    if args.scale_up:
        return scale_up_main(args, lambda n: _sim_config(args, n), trace_at)
    print(f"# cost model: prefill {args.prefill_s_per_token:.3g} s/token, decode {args.decode_s_per_step:.3g} s/step "
          f"+ {args.decode_s_per_seq:.3g} s/seq; capacity = max rate with TTFT p99 <= {args.slo_ttft_s} s")
    mesh = _sim_config(args, 1).mesh
    if mesh != MeshCost(admission_timeout_s=mesh.admission_timeout_s):
        print(f"# mesh terms: {mesh}")
    print(HEADER, flush=True)
    details: list[RunSummary] = []
    router_counts = [int(x) for x in args.routers.split(",")]
    single: dict[int, dict[str, float | None]] = {}  # capacities with one replica
    if any(k < 1 for k in router_counts):
        raise SystemExit("kvmesh sim: --routers must be >= 1")
    for n, k in ((int(x), k) for x in args.workers.split(",") for k in router_counts):
        config = _sim_config(args, n, k)
        if router_counts != [1]:
            print(f"# {n} workers, {k} scheduler replica(s)", flush=True)

        def run_at(rate: float, name: str, config: SimConfig = config) -> RunSummary:
            trace, window = trace_at(rate)
            return simulate(name, config, trace, window, args.slo_ttft_s)

        caps: dict[str, float | None] = dict.fromkeys(policies)
        if not args.no_capacity:
            for name in policies:
                print(f"# {n} workers: searching {name}'s capacity ...", file=sys.stderr, flush=True)
                _, at_cap = capacity(lambda r, name=name: run_at(r, name), args.slo_ttft_s, 8.0 * n, args.search_steps)
                caps[name] = at_cap.rate if at_cap else 0.0
        base = caps.get("round_robin")
        table_rate = args.rate * n if args.rate else (0.7 * base if base else 8.0 * n)
        rows = [run_at(table_rate, name) for name in policies]
        for summary in rows:
            print(row(summary, caps[summary.policy]), flush=True)
        details += rows
        if k == 1:
            single[n] = caps
        one_router = single.get(n)
        for name in policies:
            if k > 1 and one_router and one_router.get(name) and caps.get(name) is not None:
                print(f"# {n} workers: {name} with {k} replicas = {caps[name] / one_router[name]:.2f}x one replica's capacity",
                      flush=True)
        for name in ("kv_aware", "dualmap"):
            if caps.get(name):
                ratios = [f"{caps[name] / caps[o]:.2f}x {o}" for o in ("round_robin", "prefix_affinity") if caps.get(o)]
                if ratios:
                    print(f"# {n} workers: {name} capacity = {', '.join(ratios)}", flush=True)
    print(f"# at the same rates: TTFT p90, ITL, goodput (requests/s with TTFT <= {args.slo_ttft_s} s), errors")
    print(DETAIL_HEADER)
    for summary in details:
        print(detail_row(summary))
    return 0
