"""Does a mesh slow with use? One fresh `kvmesh up --decode N --prefill 0`, the fidelity trace
replayed again and again at one rate (each replay salted, so none finds an earlier one's prompts
cached), optionally with the calibration's probes run once in between; per replay the client's TTFT
p50 / p90 and ITL, the gateway's and the worker's mean TTFT, the engine's steps, each process's CPU
per request and its RSS.

    nice -n -10 .venv/bin/python bench/meshaging.py [--rate 12] [--replays 5] [--probe-before 2] [--set decode.X=Y]

Why: in run BK (README) the mesh the calibration had just probed served the trace 1.3-1.45x slower
than fresh meshes at the same rate; this measures that on one mesh, before and after the probes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import psutil
from simfidelity import Bench, mesh_metrics, start_mesh
from tokcost import process_cpu_s

from kvmesh.scheduler.sim.client import Target
from kvmesh.scheduler.sim.hostspeed import timed_probe
from kvmesh.scheduler.sim.meshprobe import ProbeConfig

STEP_KEYS = (("gateway_ttft_ms", "gw", ".1f"), ("worker_ttft_ms", "wk", ".1f"), ("engine_prefill_ms", "prefill", ".1f"),
             ("step_ms", "step", ".2f"), ("rows", "rows", ".2f"), ("between", "between", ".2f"))


def process_cpu(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system) of each process and its children so far; 0 for one that is gone."""
    out = {}
    for name, p in procs.items():
        try:
            out[name] = process_cpu_s(p)
        except psutil.Error:
            out[name] = 0.0
    return out


def row(i: int, summary, before: dict[str, float], after: dict[str, float], requests: float, rss_mib: dict[str, float]) -> str:
    """One replay's line: client TTFT / ITL, the step figures, CPU ms per request of each process that
    used more than 50 ms in all, RSS MiB."""
    steps = summary.steps or {}
    figures = " ".join(f"{label} {format(steps[key], fmt)}" for key, label, fmt in STEP_KEYS if key in steps)
    cpu = " ".join(f"{name} {(after[name] - before[name]) / requests * 1e3:.1f}" for name in sorted(before)
                   if after.get(name, 0.0) - before[name] > 0.05)
    rss = " ".join(f"{name} {mib:.0f}" for name, mib in sorted(rss_mib.items()))
    return (f"#{i} p50 {summary.ttft_p50_s:.3f} p90 {summary.ttft_p90_s:.3f} itl {summary.itl_p50_s * 1e3:.2f} | {figures} "
            f"| cpu ms/req {cpu} | rss MiB {rss}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--decode", type=int, default=1)
    p.add_argument("--rate", type=float, default=12.0, help="req/s of every replay")
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--probe-before", type=int, default=-1,
                   help="run the calibration's probes once before this replay (-1: never)")
    p.add_argument("--repeats", type=int, default=5, help="the probes' repeats (simfidelity's default)")
    p.add_argument("--duration-s", type=float, default=40.0)
    p.add_argument("--warmup-s", type=float, default=6.0)
    p.add_argument("--set", action="append", default=[], metavar="SERVICE.FIELD=VALUE")
    args = p.parse_args(argv)
    args.slo_ttft_s = 0.5
    bench = Bench(args)
    with tempfile.TemporaryDirectory() as run_dir:
        mesh = start_mesh(args.model, args.decode, "kv_aware", run_dir, tuple(args.set))
        try:
            procs = {r.spec.name: psutil.Process(r.proc.pid) for r in mesh.procs}
            for i in range(args.replays):
                if i == args.probe_before:
                    t = time.monotonic()
                    timed_probe(Target(mesh.gateway_url), ProbeConfig(repeats=args.repeats, workers=args.decode))
                    print(f"# the calibration's probes ran: {time.monotonic() - t:.0f} s", flush=True)
                before = process_cpu(procs)
                summary = bench.real(mesh.gateway_url, "kv_aware", args.decode, args.rate, mesh_metrics(mesh))
                after = process_cpu(procs)
                rss = {name: proc.memory_info().rss / 2**20 for name, proc in procs.items() if proc.is_running()}
                print(f"{row(i, summary, before, after, args.rate * args.duration_s, rss)} ({time.strftime('%H:%M:%S')})",
                      flush=True)
        finally:
            mesh.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
