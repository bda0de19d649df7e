"""What the replay's own HTTP client adds to the TTFTs it measures: the same mesh, the fidelity
trace replayed with the lean client (`raw`, rawclient.py) and with httpx, alternating.

    nice -n -10 .venv/bin/python bench/replayclient.py [--rate 13.5] [--decode 2] [--rounds 3]

Starts `kvmesh up --decode N --prefill 0 --policy kv_aware` (tiny; `--model DIR` for any), replays
bench/simfidelity.py's trace at `--rate` once to warm the mesh's kernel caches, then `--rounds`
rounds of one replay per client in turn (the order swapped every round, a fresh salt every replay).
Per replay: the client's TTFT p50 / p90 / mean over requests sent after `--warmup-s`, the gateway's
own TTFT mean (its `kvmesh_gateway_ttft_seconds`, handler start to first token, over the whole
replay), the client's CPU per request (this process's CPU time; the client is all it runs then),
how late its event loop ran a 5 ms timer, and the host's 1-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from simfidelity import mean_ms, read_text, trace_config, watched

from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh
from kvmesh.scheduler.sim.client import Target
from kvmesh.scheduler.sim.replay import ReplayConfig, replay
from kvmesh.scheduler.sim.report import quantile
from kvmesh.scheduler.sim.trace import synthetic, without_output_blocks

HISTOGRAM = "kvmesh_gateway_ttft_seconds"


def one(url: str, gateway: str, trace: list, kind: str, warmup_s: float) -> str:
    before = read_text(gateway)
    cpu0 = time.process_time()
    outcomes, lag_ms = asyncio.run(watched(replay(trace, ReplayConfig(Target(url, timeout_s=60.0, client=kind)))))
    cpu_ms = 1e3 * (time.process_time() - cpu0) / len(trace)
    gateway_ms = mean_ms([before], [read_text(gateway)], HISTOGRAM)
    start = trace[0].arrival_s + warmup_s
    ttft = [o.ttft_s * 1e3 for o in outcomes if o.ok and o.arrival_s >= start]
    errors = sum(not o.ok for o in outcomes)
    return (f"| {kind} | {len(ttft)} | {errors} | {quantile(ttft, 0.5):.1f} | {quantile(ttft, 0.9):.1f} | "
            f"{statistics.fmean(ttft):.1f} | {gateway_ms:.1f} | {cpu_ms:.2f} | {lag_ms:.2f} | {os.getloadavg()[0]:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=13.5, help="req/s of the trace")
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=46.0, help="the trace's length (simfidelity's window: 6 + 40)")
    p.add_argument("--warmup-s", type=float, default=6.0)
    p.add_argument("--model", default="tiny")
    args = p.parse_args()
    trace = without_output_blocks(synthetic(trace_config(args), args.rate))
    mesh = Mesh(MeshOptions(model=args.model, port=free_port(), run_dir=tempfile.mkdtemp(prefix="kvmesh-replayclient-"),
                            prefill=0, decode=args.decode, policy="kv_aware"))
    mesh.start(timeout_s=240)
    try:
        gateway = next(s.metrics_target for s in mesh.specs if s.service == "gateway")
        url = mesh.gateway_url
        print(f"# kvmesh up --decode {args.decode} --prefill 0 (model {args.model}); {len(trace)} requests at "
              f"{args.rate:g} req/s; TTFT ms; client CPU ms per request; loop lag: a 5 ms timer's mean lateness, ms")
        asyncio.run(replay(trace, ReplayConfig(Target(url, timeout_s=60.0))))  # warm-up, not reported
        print("| client | requests | errors | TTFT p50 | p90 | mean | gateway TTFT mean | client CPU | loop lag | load |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for round_ in range(args.rounds):
            for kind in ("raw", "httpx") if round_ % 2 == 0 else ("httpx", "raw"):
                print(one(url, gateway, trace, kind, args.warmup_s), flush=True)
    finally:
        mesh.stop()


if __name__ == "__main__":
    main()
