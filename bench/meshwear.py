"""Does a mesh hold a rate as well after heavy use as fresh? Replays of the fidelity trace on one
`kvmesh up --decode N --prefill 0`, in the order a plan gives, with the calibration's probes between
them if asked.

    nice -n -10 .venv/bin/python bench/meshwear.py [--decode 2] [--plan r28,p3,r28,r28,r28]

A plan step is `rRATE` (one replay of bench/simfidelity.py's trace at RATE req/s, as its capacity
search sends it), `pREPEATS` (one pass of `kvmesh sim calibrate`'s probes with that many repeats,
not fitted) or `gSECONDS` (idle). After each replay it prints the TTFT p50 / p99, ITL p50 and
errors, every mesh process's CPU seconds during it (a worker's engine process as `NAME/engine`, and
this process's, the replay's or probes' client, as `client`), each decode worker's requests, and
what each worker's engine ran (steps, decode and prefill busy seconds, prefill and decode steps and
their decode rows, prompt and prefix-hit tokens, from its /metrics), the KV store's blocks and LRU
evictions, and each process's RSS.
Why: bench/simfidelity.py searches the real capacity on a mesh its calibration has just probed,
and the README (simulator, stop 44) found replays there slower than on a fresh mesh.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import simfidelity
from soakstats import metric_in

from kvmesh.runtime.supervisor import Mesh
from kvmesh.scheduler.sim.client import Target
from kvmesh.scheduler.sim.hostcpu import task_cpu_s
from kvmesh.scheduler.sim.hostspeed import timed_probe
from kvmesh.scheduler.sim.meshprobe import ProbeConfig

TICK = float(os.sysconf("SC_CLK_TCK"))
ENGINE = (("steps", "kvmesh_decode_engine_steps_total", {}),
          ("decode_s", "kvmesh_decode_engine_busy_seconds_total", {"kind": "decode"}),
          ("prefill_s", "kvmesh_decode_engine_busy_seconds_total", {"kind": "prefill"}),
          ("prefill_steps", "kvmesh_decode_model_steps_total", {"kind": "prefill"}),
          ("prefill_rows", "kvmesh_decode_step_decode_rows_total", {"kind": "prefill"}),
          ("decode_steps", "kvmesh_decode_model_steps_total", {"kind": "decode"}),
          ("decode_rows", "kvmesh_decode_step_decode_rows_total", {"kind": "decode"}),
          ("prompt_tokens", "kvmesh_decode_prefix_query_tokens_total", {}),
          ("hit_tokens", "kvmesh_decode_prefix_hit_tokens_total", {}),
          ("requests", "kvmesh_decode_requests_total", {}))


def pids(pid: int) -> list[int]:
    """`pid` and its children (a decode worker's engine process)."""
    return [pid, *(int(c) for c in os.popen(f"pgrep -P {pid}").read().split())]


def per_process(mesh: Mesh, name: str, value: Callable[[str], float]) -> dict[str, float]:
    """`value` of /proc/PID/`name`'s text for each mesh process, and summed over its children (a decode
    worker's engine process) as `NAME/engine` where it has any."""
    out = {}
    for spec in mesh.specs:
        pid, *children = pids(mesh.pid_of(spec.name))
        out[spec.name] = value(Path(f"/proc/{pid}/{name}").read_text())
        if children:
            out[f"{spec.name}/engine"] = sum(value(Path(f"/proc/{c}/{name}").read_text()) for c in children)
    return out


def cpu_s(mesh: Mesh) -> dict[str, float]:
    """Each mesh process's user + system CPU seconds so far (an engine process on its own), and this
    process's own (`client`: the replay's or the probes' client, which shares the host with the mesh)."""
    return {**per_process(mesh, "stat", lambda text: task_cpu_s(text, TICK)), "client": time.process_time()}


def rss_mib(mesh: Mesh) -> dict[str, int]:
    pages = per_process(mesh, "statm", lambda text: float(text.split()[1]))
    return {k: int(v) * os.sysconf("SC_PAGE_SIZE") // 2**20 for k, v in pages.items()}


def worker_figures(mesh: Mesh) -> dict[str, dict[str, float]]:
    out = {}
    for spec in mesh.specs:
        if spec.service == "decode" and spec.metrics_target:
            text = simfidelity.read_text(spec.metrics_target)
            out[spec.name] = {label: metric_in(text, name, **labels) for label, name, labels in ENGINE}
        elif spec.service == "kvstore" and spec.metrics_target:
            text = simfidelity.read_text(spec.metrics_target)
            out[spec.name] = {"blocks": metric_in(text, "kvmesh_kvstore_blocks"),
                              "evictions": metric_in(text, "kvmesh_kvstore_evictions_total")}
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> str:
    return ", ".join(f"{k} {after[k] - before.get(k, 0.0):.1f}" for k in after)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--plan", default="r28,p3,r28,r28,r28")
    p.add_argument("--model", default="tiny")
    args = p.parse_args()
    bench = simfidelity.Bench(argparse.Namespace(duration_s=40.0, warmup_s=6.0, slo_ttft_s=0.5, model=args.model))
    mesh = simfidelity.start_mesh(args.model, args.decode, "kv_aware", tempfile.mkdtemp(prefix="kvmesh-wear-"))
    print(f"kvmesh up --decode {args.decode} --prefill 0 (model {args.model}); load average {os.getloadavg()[0]:.1f}")
    try:
        for step in args.plan.split(","):
            kind, value = step[0], float(step[1:])
            before, figures, t0 = cpu_s(mesh), worker_figures(mesh), time.monotonic()
            if kind == "g":
                time.sleep(value)
                print(f"idle {value:g} s: CPU s {delta(cpu_s(mesh), before)}", flush=True)
                continue
            if kind == "p":
                timed_probe(Target(mesh.gateway_url), ProbeConfig(repeats=int(value), workers=args.decode))
                head = f"probes x{value:g}"
            elif kind == "r":
                s = bench.real(mesh.gateway_url, "kv_aware", args.decode, value)
                head = (f"replay {value:g} req/s: TTFT p50 {s.ttft_p50_s:.3f} p99 {s.ttft_p99_s:.3f}, ITL p50 "
                        f"{s.itl_p50_s * 1e3:.2f} ms, errors {s.errors or '-'}")
            else:
                raise SystemExit(f"plan step {step!r}: expected rRATE, pREPEATS or gSECONDS")
            print(f"{head} ({time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})", flush=True)
            print(f"    CPU s: {delta(cpu_s(mesh), before)}")
            after = worker_figures(mesh)
            for name, values in after.items():
                print(f"    {name}: {delta(values, figures.get(name, {}))}")
            print("    RSS MiB: " + ", ".join(f"{k} {v}" for k, v in rss_mib(mesh).items()), flush=True)
    finally:
        mesh.stop()


if __name__ == "__main__":
    sys.exit(main())
