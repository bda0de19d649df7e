"""What sharing the GIL with a busy event-loop thread costs the engine thread, in one run.

    .venv/bin/python bench/gilshare.py [--model tiny|DIR] [--rounds 3]

A decode worker's engine thread steps the model while the worker's event loop (gRPC, the token
stream, the KV hand-back) runs Python on another thread of the same process. Every torch op
releases the GIL and takes it back, so whenever the loop thread holds it the engine waits, and
every hand-over costs both threads CPU. This runs the in-process engine on the same closed-loop
load as bench/tokcost.py (128 requests x 128 tokens at concurrency 32), alternately alone and
beside a thread that does event-loop-like Python work in short bursts, and beside a process that
does the same work (the other core busy, no GIL shared: what sharing the host's cores costs on its
own), and prints the engine thread's CPU and wall time per output token for each. It is the
evidence for moving the engine into its own process (issue 13); it changes nothing in the mesh.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def busy_loop(stop) -> None:  # noqa: ANN001 - a threading or multiprocessing Event
    """Python work in ~1 ms bursts with short sleeps between, like a loaded RPC event loop."""
    x = 0
    while not stop.is_set():
        for _ in range(2000):
            x += len({"a": 1, "b": [1, 2, 3]})
        time.sleep(0.0005)


def run(engine, prompts, params, tag: str) -> tuple[float, float]:
    """The engine thread's (CPU, wall) µs per output token over tokcost's closed loop at concurrency 32."""
    import tokcost

    cpu0, t0 = time.thread_time(), time.perf_counter()
    tokens, _ = tokcost.closed_loop(engine, prompts, params, 32, tag=f"{tag}-")
    return (time.thread_time() - cpu0) / tokens * 1e6, (time.perf_counter() - t0) / tokens * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import torch

    import tokcost
    from kvmesh.engine.llm import EngineConfig, LLMEngine
    from kvmesh.engine.sampling import SamplingParams
    from kvmesh.engine.tiny import resolve_model
    from kvmesh.engine.tokenizer import Tokenizer
    from kvmesh.runtime.launcher import worker_threads

    torch.set_num_threads(worker_threads(os.cpu_count() or 1, 1))
    tok = Tokenizer.from_dir(resolve_model(args.model))
    prompts = [tokcost._chat_ids(tok, tokcost.messages(i)) for i in range(128)]
    engine = LLMEngine(EngineConfig(model=args.model))
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    run(engine, prompts[:8], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), "warmup")
    rows: dict[str, list[tuple[float, float]]] = {"alone": [], "beside a busy thread": [], "beside a busy process": []}
    for r in range(args.rounds):
        rows["alone"].append(run(engine, prompts, params, f"a{r}"))
        for row, kind in (("beside a busy thread", threading), ("beside a busy process", multiprocessing.get_context("spawn"))):
            stop = kind.Event()
            neighbour = (kind.Thread if kind is threading else kind.Process)(target=busy_loop, args=(stop,), daemon=True)
            neighbour.start()
            try:
                rows[row].append(run(engine, prompts, params, f"{row[-7]}{r}"))
            finally:
                stop.set()
                neighbour.join()
    print(f"engine thread per output token, model {args.model}, {args.rounds} alternating rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| engine thread | CPU µs per token (each round) | wall µs per token (each round) |\n|---|---|---|")
    for name, values in rows.items():
        cpu = ", ".join(f"{c:.0f}" for c, _ in values)
        wall = ", ".join(f"{w:.0f}" for _, w in values)
        print(f"| {name} | {cpu} | {wall} |")
    mean = {name: sum(c for c, _ in v) / len(v) for name, v in rows.items()}
    print(f"CPU beside a busy thread / alone: {mean['beside a busy thread'] / mean['alone']:.2f}x; "
          f"beside a busy process / alone: {mean['beside a busy process'] / mean['alone']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
