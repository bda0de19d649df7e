"""What a crowded host does to the engine's CPU per token: the in-process engine alone, then beside
copies of itself, so that more busy processes than cores share the host, as a whole mesh does.

    nice -n 5 .venv/bin/python bench/crowding.py [--model tiny|DIR] [--rounds 2] [--beside 1,2,3]

Each run is `bench/tokcost.py`'s in-process engine (its own process, torch threads as a lone mesh
worker gets them) on the same prompts at concurrency 32; the figure is the measured copy's CPU time
per output token (the copies beside it run the same load and are not counted). The levels
alternate within each round, so a drift of the host moves them alike. The code is the same at every
level: what changes is only how many busy processes take turns on the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TOKCOST = Path(__file__).resolve().parent / "tokcost.py"


def engine_argv(model: str, requests: int) -> list[str]:
    return [sys.executable, str(TOKCOST), "--engine-child", "--model", model, "--requests", str(requests),
            "--concurrency", "32", "--max-tokens", "128"]


def run_level(model: str, requests: int, beside: int) -> dict:
    """The measured engine's figures with `beside` copies running the same load alongside it."""
    # NOTE: the copies get more requests than the measured one, so they are still busy when it ends.
    others = [subprocess.Popen(engine_argv(model, requests * 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(beside)]
    try:
        done = subprocess.run(engine_argv(model, requests), capture_output=True, text=True, check=True)
    finally:
        for p in others:
            p.kill()
            p.wait()
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {"us_per_token": out["cpu_s"] / out["tokens"] * 1e6, "tok_s": out["tokens"] / out["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--beside", default="1,2,3", help="comma-separated counts of busy copies beside the measured one")
    args = p.parse_args(argv)
    levels = [0] + [int(x) for x in args.beside.split(",") if x]
    cpus = os.cpu_count() or 1
    print(f"in-process engine, model {args.model}, {args.requests} requests x 128 tokens at concurrency 32, {cpus} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    results: dict[int, list[dict]] = {n: [] for n in levels}
    for r in range(args.rounds):
        for n in levels:
            results[n].append(run_level(args.model, args.requests, n))
            got = results[n][-1]
            print(f"round {r + 1}: {n + 1} busy processes on {cpus} cores: {got['us_per_token']:.1f} µs per token, "
                  f"{got['tok_s']:.0f} tok/s", flush=True)
    alone = sum(x["us_per_token"] for x in results[0]) / len(results[0])
    print("\n| busy processes | CPU µs per token (each round) | / alone |\n|---|---|---|")
    for n in levels:
        runs = [x["us_per_token"] for x in results[n]]
        print(f"| {n + 1} on {cpus} cores | {', '.join(f'{x:.1f}' for x in runs)} | {sum(runs) / len(runs) / alone:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
