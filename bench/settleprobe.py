"""Does a probe run find the worker quiet? A lone stream's ITL quiet, right after a heavy probe
point, and `--settle-s` after it.

    flock /tmp/kvmesh-bench.lock nice -n -10 .venv/bin/python bench/settleprobe.py [--heavy 16x1024] [--repeats 5]

(as root, like bench/simfidelity.py, whose priority set-up it shares.) It starts `kvmesh up --decode 1
--prefill 0` (tiny) and, `--repeats` times: a lone stream (its ITL as the calibration's ITL probe
measures it: `stream_tokens` tokens, a 32-token prompt) after 1 s of quiet; the heavy point (k
streams of n-token prompts at once); a lone stream as soon as they end; another `--settle-s` later.
A decode worker hands every finished turn's KV to the store after it ends (decode/handback.py), so
right after a heavy point the lone stream shares the worker with that work; the calibration waits
`settle_s` (meshprobe.ProbeConfig) before every probe run for this reason, and fits the hand-back's
own cost (sim/handback.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile

from simfidelity import group_priority, start_mesh

from kvmesh.scheduler.sim.client import Target, new_client, served_model
from kvmesh.scheduler.sim.meshprobe import ProbeConfig, _Prober


async def probe(url: str, heavy: tuple[int, int], repeats: int, settle_s: float) -> dict[str, list[float]]:
    target = Target(url, timeout_s=60.0)
    itls: dict[str, list[float]] = {"quiet": [], "right after": [], f"{settle_s:g} s after": []}
    async with new_client(target) as client:
        prober = _Prober(client, target, await served_model(client, target), ProbeConfig(settle_s=0.0))
        for _ in range(3):
            await prober.one(prober.prompt(32), 4)  # warm-up
        for _ in range(repeats):
            await asyncio.sleep(1.0)
            itls["quiet"].append(await prober.steady(1, 32))
            await prober.steady(*heavy)
            itls["right after"].append(await prober.steady(1, 32))
            await asyncio.sleep(settle_s)
            itls[f"{settle_s:g} s after"].append(await prober.steady(1, 32))
    return itls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heavy", default="16x1024", help="STREAMSxPROMPT_TOKENS of the heavy point")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--settle-s", type=float, default=ProbeConfig().settle_s)
    args = p.parse_args(argv)
    k, n = (int(x) for x in args.heavy.split("x"))
    before = group_priority(None)
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            mesh = start_mesh("tiny", 1, "kv_aware", run_dir)
            try:
                print(f"# settleprobe: kvmesh up --decode 1 --prefill 0 (tiny), heavy point {k}x{n}, "
                      f"load average {os.getloadavg()[0]:.1f}, nice {os.nice(0)}", flush=True)
                itls = asyncio.run(probe(mesh.gateway_url, (k, n), args.repeats, args.settle_s))
            finally:
                mesh.stop()
    finally:
        if before is not None:
            group_priority(before)
    for when, values in itls.items():
        print(f"lone stream ITL {when:>12}: median {statistics.median(values) * 1e3:.2f} ms "
              f"({', '.join(f'{v * 1e3:.2f}' for v in values)})")
    print(f"# load average {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
