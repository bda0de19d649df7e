"""What padding a step's rows to a bucket (`cpu_row_buckets`, services/engine/linear.py) saves on CPU,
measured side by side in one run.

    .venv/bin/python bench/rowbuckets.py [--model tiny|DIR] [--rounds 2] [--requests 300]

Each round runs the in-process engine twice, in a fresh process each (the oneDNN kernel caches are
per process), without and then with the buckets (the order alternates by round): one request at a
time, a prompt of 32-700 random tokens (the same sequence on both sides), one output token, prefix
caching off, so every request is one prefill step at its own token count, as a trace's are. It
prints the prefill's CPU time (p50, mean, p90, the first 50 requests left out as warm-up), the
process's RSS at the end, and the ratios. The kernel caches are capped as a worker caps them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

WARMUP = 50


def child(model: str, buckets: bool, requests: int) -> dict[str, float]:
    """One side, in this process: per-request prefill CPU seconds and the RSS."""
    import torch  # noqa: PLC0415

    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415

    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig(model=model, cpu_row_buckets=buckets, enable_prefix_caching=False))
    rng = random.Random(1)
    vocab = engine.model_args.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    took = []
    for _ in range(requests):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(32, 701))]
        start = time.process_time()
        engine.generate([prompt], params)
        took.append(time.process_time() - start)
    took = sorted(took[WARMUP:])
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return {"p50": took[len(took) // 2], "mean": sum(took) / len(took), "p90": took[int(len(took) * 0.9)], "rss": rss}


def run_side(model: str, buckets: bool, requests: int) -> dict[str, float]:
    # NOTE: the caps a worker sets (services/worker/settings.py bound_cpu_kernel_caches), before torch loads
    env = {**os.environ, "LRU_CACHE_CAPACITY": "256", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}
    out = subprocess.run([sys.executable, __file__, "--child", model, str(int(buckets)), str(requests)],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=300)
    args = p.parse_args()
    print("| round | buckets | prefill CPU p50 ms | mean ms | p90 ms | RSS MiB |\n|---|---|---|---|---|---|")
    ratios = []
    for r in range(args.rounds):
        sides = {}
        for buckets in ((False, True) if r % 2 == 0 else (True, False)):
            s = sides[buckets] = run_side(args.model, buckets, args.requests)
            print(f"| {r + 1} | {'on' if buckets else 'off'} | {s['p50'] * 1e3:.2f} | {s['mean'] * 1e3:.2f} | "
                  f"{s['p90'] * 1e3:.2f} | {s['rss']:.0f} |", flush=True)
        ratios.append({k: sides[True][k] / sides[False][k] for k in ("p50", "mean", "rss")})
    for r, q in enumerate(ratios):
        print(f"# round {r + 1}: on / off: prefill p50 {q['p50']:.2f}x, mean {q['mean']:.2f}x, RSS {q['rss']:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]))))
    else:
        main()
