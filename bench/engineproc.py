"""What the decode engine's process boundary costs per output token, at full batches, in one run.

    nice -n 5 .venv/bin/python bench/engineproc.py [--model tiny|DIR] [--rounds 2]

Runs the same closed-loop load (128 requests x 128 tokens, 32 in flight, refilled as they end)
on the in-process engine and through an engine process (`kvmesh.worker.engineproc`, the decode
worker's `engine_process` setting, with no gRPC or mesh around it), alternately, each in a fresh
process, and prints CPU µs per output token (the engine process's own, all threads, and its
parent's), tokens per step and tokens per second. The difference between the in-process engine
and the engine process is what the wire (step frames, commands) costs; bench/tokcost.py measures
the whole mesh.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

REQUESTS, CONCURRENCY, MAX_TOKENS = 128, 32, 128


def prompts() -> list[list[int]]:
    return [[100 + i % 50, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, i % 200, 5] for i in range(REQUESTS)]


def settings(model: str, engine_process: bool):
    from kvmesh.decode.config import DecodeSettings
    from kvmesh.runtime.launcher import worker_threads

    return DecodeSettings(model=model, nats_url="", port=0, metrics_port=-1, engine_process=engine_process,
                          torch_threads=worker_threads(os.cpu_count() or 1, 1))  # what a lone mesh worker gets


def cpu_s(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def in_process(model: str) -> str:
    import psutil

    from kvmesh.engine.llm import LLMEngine
    from kvmesh.engine.sampling import SamplingParams
    from kvmesh.worker.settings import engine_config

    engine, ids = LLMEngine(engine_config(settings(model, False))), prompts()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def drive(n: int, tag: str) -> tuple[int, int]:
        added = live = tokens = steps = 0
        while added < n or engine.has_unfinished_requests():
            while live < CONCURRENCY and added < n:
                engine.add_request(f"{tag}{added}", ids[added], params)
                added, live = added + 1, live + 1
            for out in engine.step():
                tokens += len(out.new_token_ids)
                live -= out.finished
            steps += 1
        return tokens, steps

    drive(8, "warm")
    me, t0 = psutil.Process(), time.perf_counter()
    c0 = cpu_s(me)
    tokens, steps = drive(REQUESTS, "r")
    return (f"| in-process engine | {(cpu_s(me) - c0) / tokens * 1e6:.0f} | | {tokens / steps:.1f} | "
            f"{tokens / (time.perf_counter() - t0):.0f} |")


async def through_a_process(model: str) -> str:
    import psutil

    from kvmesh.engine.sampling import SamplingParams
    from kvmesh.worker.engineproc import EngineProcess

    engine = await EngineProcess.spawn("kvmesh.decode.enginehost", settings(model, True))
    engine.start()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    ids, slots, tokens = prompts(), asyncio.Semaphore(CONCURRENCY), 0

    async def one(request_id: str, prompt: list[int]) -> None:
        nonlocal tokens
        async with slots:
            done = asyncio.get_running_loop().create_future()

            def deliver(out) -> None:
                nonlocal tokens
                tokens += len(out.new_token_ids)
                if out.finished:
                    done.set_result(None)

            await engine.start_request(request_id, deliver, "add_prefilled", request_id, prompt, params, False, None, 0)
            await done

    await asyncio.gather(*(one(f"warm{i}", ids[i]) for i in range(8)))
    child, me, tokens, steps, t0 = psutil.Process(engine.pid), psutil.Process(), 0, engine.num_steps, time.perf_counter()
    c0, p0 = cpu_s(child), cpu_s(me)
    await asyncio.gather(*(one(f"r{i}", p) for i, p in enumerate(ids)))
    line = (f"| engine process | {(cpu_s(child) - c0) / tokens * 1e6:.0f} | {(cpu_s(me) - p0) / tokens * 1e6:.0f} | "
            f"{tokens / (engine.num_steps - steps):.1f} | {tokens / (time.perf_counter() - t0):.0f} |")
    await engine.stop()
    return line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", choices=["in-process", "process"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "in-process":
        print(in_process(args.model))
        return 0
    if args.child == "process":
        print(asyncio.run(through_a_process(args.model)))
        return 0
    print(f"{REQUESTS} requests x {MAX_TOKENS} tokens, {CONCURRENCY} in flight, model {args.model}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("| engine | CPU µs/token (engine) | CPU µs/token (its parent) | tokens/step | tokens/s |\n|---|---|---|---|---|")
    for _ in range(args.rounds):
        for child in ("in-process", "process"):
            argv = [sys.executable, __file__, "--child", child, "--model", args.model]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
