"""The same workload through the full mesh and through the in-process engine, in one run.

    .venv/bin/python bench/mesh.py [--model small|tiny|DIR] [--requests 32] [--concurrency 8] [--prompt-tokens 64] [--max-tokens 32]
                              [--tracing-pairs 3]

Prints throughput (output tok/s) and TTFT p50/p99 for: the in-process engine, the mesh with a
prefill and a decode worker (KV pushed over gRPC), the mesh with one decode worker prefilling
locally, and the disaggregated mesh with tracing off; then the ratios, and what tracing costs
as mesh CPU time per output token (robust on a loaded machine, where wall-time ratios are not).
That last ratio moves ±0.1 from run to run here, so `--tracing-pairs N` (default 3) runs the
disaggregated mesh with and without tracing N times in all, alternating which goes first, and
prints every pair's ratio and their median.
Ratios, not absolute numbers, are the result: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from checkpoints import SMALL_LLAMA_BYTES, build_llama


@dataclass
class Result:
    name: str
    wall_s: float
    output_tokens: int
    ttfts: list[float]
    span_ms: dict[str, float] | None = None  # mean duration per span name, from the mesh's traces
    cpu_s: float = 0.0  # CPU time of every mesh process during the load (user + system)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / max(1, self.output_tokens) * 1e6

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def make_prompts(n: int, length: int) -> list[list[int]]:
    return [[32 + (i * 7 + j * 13) % 90 for j in range(length)] for i in range(n)]


def run_in_process(model: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Result:
    import os

    import torch

    from kvmesh.engine.llm import EngineConfig, LLMEngine
    from kvmesh.engine.sampling import SamplingParams
    from kvmesh.runtime.launcher import worker_threads

    # NOTE: the same torch threads a lone mesh worker gets, so the engine side is not starved
    # (or favoured) by its thread count.
    torch.set_num_threads(worker_threads(os.cpu_count() or 1, 1))

    engine = LLMEngine(EngineConfig(model=model, dtype="float32"))
    engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=4))  # warm up
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    pending = list(enumerate(prompts))
    started: dict[str, float] = {}
    ttft: dict[str, float] = {}
    inflight = 0
    tokens = 0
    t0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and inflight < concurrency:
            i, prompt = pending.pop(0)
            started[f"r{i}"] = time.perf_counter()
            engine.add_request(f"r{i}", prompt, params)
            inflight += 1
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.new_text and out.request_id not in ttft:  # first visible text, as the client sees it
                ttft[out.request_id] = time.perf_counter() - started[out.request_id]
            inflight -= out.finished
    return Result("in-process engine", time.perf_counter() - t0, tokens, list(ttft.values()))


def run_mesh(name: str, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int, **options) -> Result:
    import openai
    import psutil

    from kvmesh.runtime.launcher import MeshOptions, free_port
    from kvmesh.runtime.supervisor import Mesh

    with tempfile.TemporaryDirectory() as run_dir:
        mesh = Mesh(MeshOptions(model=model, port=free_port(), run_dir=run_dir, kvstore=False, **options))
        served = Path(model).name if model != "tiny" else "tiny"
        mesh.start(timeout_s=180)
        try:
            client = openai.OpenAI(base_url=f"{mesh.gateway_url}/v1", api_key="x", max_retries=0, timeout=300)
            client.completions.create(model=served, prompt=prompts[0], max_tokens=4)  # warm up
            lock = threading.Lock()
            ttfts: list[float] = []
            tokens = 0

            def one(prompt: list[int]) -> None:
                nonlocal tokens
                t = time.perf_counter()
                first = None
                count = 0
                for chunk in client.completions.create(model=served, prompt=prompt, max_tokens=max_tokens,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True},
                                                       extra_body={"ignore_eos": True}):
                    if chunk.choices and chunk.choices[0].text and first is None:
                        first = time.perf_counter() - t
                    if chunk.usage:
                        count = chunk.usage.completion_tokens
                with lock:
                    ttfts.append(first or 0.0)
                    tokens += count

            procs = [psutil.Process(r.proc.pid) for r in mesh.procs]
            cpu0 = sum(_cpu(p) for p in procs)
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(one, prompts))
            wall = time.perf_counter() - t0
            cpu = sum(_cpu(p) for p in procs) - cpu0
        finally:
            mesh.stop()  # flushes every process's spans
        return Result(name, wall, tokens, ttfts, span_means(Path(run_dir) / "traces"), cpu)


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def span_means(trace_dir: Path) -> dict[str, float]:
    """Where the time goes: the mean duration (ms) of each span name over the run."""
    from kvmesh.runtime.tracecli import load_spans

    durations: dict[str, list[float]] = {}
    for span in load_spans(trace_dir)[0] if trace_dir.exists() else []:
        durations.setdefault(f"{span.service}: {span.name}", []).append(span.duration_ns / 1e6)
    return {name: sum(ms) / len(ms) for name, ms in durations.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tracing-pairs", type=int, default=3,
                   help="disaggregated meshes with and without tracing, alternating, for the tracing ratio (the table's pair is the first)")
    p.add_argument("--model", default="small",
                   help="'small' (a ~22M-param random Llama built here), 'tiny', or an HF model directory")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_llama(Path(tmp), **SMALL_LLAMA_BYTES)[1]) if args.model == "small" else args.model
        return run_all(args, model)


def run_all(args: argparse.Namespace, model: str) -> int:
    prompts = make_prompts(args.requests, args.prompt_tokens)
    work = (model, prompts, args.max_tokens, args.concurrency)
    # NOTE: the scheduler would prefill short prompts on the decode worker itself; force the
    # disaggregated path so these rows measure KV crossing processes.
    remote = ["scheduler.local_prefill_max_tokens=0"]

    def disaggregated(name: str, tracing: bool = True) -> Result:
        return run_mesh(name, *work, prefill=1, decode=1, settings=remote, env={} if tracing else {"KVMESH_TRACING": "false"})

    results = [
        run_in_process(*work),
        disaggregated("mesh: prefill + decode (KV over gRPC)"),
        run_mesh("mesh: decode only (local prefill)", *work, prefill=0, decode=1),
        disaggregated("mesh: prefill + decode, tracing off", tracing=False),
    ]
    base = results[0]
    print(f"\n{args.requests} requests, {args.prompt_tokens} prompt tokens, {args.max_tokens} output tokens, "
          f"concurrency {args.concurrency}, model {args.model}\n")
    print(f"{'setup':42} {'tok/s':>8} {'ratio':>6} {'TTFT p50 ms':>12} {'p99 ms':>8} {'+p50 ms':>8}")
    for r in results:
        print(f"{r.name:42} {r.throughput:8.1f} {r.throughput / base.throughput:6.2f} "
              f"{r.pct(0.5) * 1e3:12.1f} {r.pct(0.99) * 1e3:8.1f} {(r.pct(0.5) - base.pct(0.5)) * 1e3:8.1f}")
    if results[1].span_ms:
        print(f"\nwhere the time goes in '{results[1].name}' (mean span duration, ms; spans nest):")
        for span, ms in sorted(results[1].span_ms.items(), key=lambda kv: -kv[1]):
            print(f"  {ms:9.1f}  {span}")
    traced, untraced = results[1], results[3]
    print(f"\ntracing overhead: throughput with tracing / without = {traced.throughput / untraced.throughput:.2f}; "
          f"mesh CPU per output token with / without = {traced.cpu_us_per_token:.0f} / {untraced.cpu_us_per_token:.0f} µs "
          f"= {traced.cpu_us_per_token / untraced.cpu_us_per_token:.3f} (less sensitive to a loaded machine)")
    ratios = [traced.cpu_us_per_token / untraced.cpu_us_per_token]
    for pair in range(1, max(1, args.tracing_pairs)):
        if pair % 2:  # NOTE: the table's pair ran traced first; the next goes untraced first, and so on
            off = disaggregated("tracing off", tracing=False)
            on = disaggregated("tracing on")
        else:
            on = disaggregated("tracing on")
            off = disaggregated("tracing off", tracing=False)
        ratios.append(on.cpu_us_per_token / off.cpu_us_per_token)
    if len(ratios) > 1:
        print(f"tracing, mesh CPU per output token with / without, {len(ratios)} pairs (alternating order): "
              f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
