"""KV pre-warming of a decode worker that joins a running mesh, measured in one run.

    .venv/bin/python bench/prewarm.py [--prompts 20] [--prompt-tokens 960]

A mesh (KV store, one decode worker that prefills locally, no prefill worker) serves traffic on
`--prompts` hot shared system prompts (each used by several requests; the decode worker hands
every finished turn to the KV store). Then two more decode workers join the running mesh side by
side, in pools of their own so production traffic leaves them alone:

- `decode-warm` is pre-warmed: the scheduler asks it to fetch the hottest prefixes from the store;
- `decode-cold` is the same worker without pre-warming (started without a KV store to fetch from,
  so the scheduler's request fails and it starts cold).

Each then serves its first `--prompts` requests (one per hot system prompt plus a new question,
sent straight to the worker over gRPC, alternating which worker goes first). Printed: TTFT p50 of
those requests, warm vs cold (goal: ratio ≤ 0.5), the first request alone, and what the warm-up
took (blocks, seconds). The model is the ~22M-parameter random Llama of bench/prefix.py.

NOTE: with a single shared prompt only a cold worker's *first* request pays the full prefill; its
own prefix cache serves the next ones. A worker that joins a mesh with many hot prefixes (tenants,
apps, long documents) misses on each of them once, which is what the first-20 figure measures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from checkpoints import SMALL_LLAMA_BYTES, build_llama


def _tokens(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 256 for i in range(length)]


def _metric(target: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name) and not line.startswith("#"))


def _workers(scheduler: str) -> dict[str, object]:
    import grpc  # noqa: PLC0415

    from kvmesh.runtime.pb import scheduler_pb2, scheduler_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(scheduler) as channel:
        reply = scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=5)
    return {w.worker_id: w for w in reply.workers}


def _add_decode(mesh, name: str, with_store: bool):
    """A decode worker like decode-0, in a pool of its own, added to the running mesh."""
    from kvmesh.runtime.launcher import ProcessSpec, free_port  # noqa: PLC0415

    base = next(s for s in mesh.specs if s.name == "decode-0")
    store = next(s for s in mesh.specs if s.service == "kvstore").grpc_endpoint
    host, port, mport = mesh.opts.host, free_port(), free_port()
    args = ["--host", host, "--port", str(port), "--metrics-port", str(mport), "--worker-id", name, "--pool", name]
    args += ["--kvstore", store] if with_store else []
    mesh.add(ProcessSpec(name, "decode", tuple(args), dict(base.env), grpc_endpoint=f"{host}:{port}",
                         metrics_target=f"{host}:{mport}", pool=name))
    return f"{host}:{port}"


async def _ttft(endpoint: str, prompt: list[int], request_id: str) -> float:
    import grpc  # noqa: PLC0415

    from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc  # noqa: PLC0415

    sampling = common_pb2.SamplingParams(temperature=0.0, top_p=1.0, max_tokens=2, ignore_eos=True)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        start = time.perf_counter()
        call = decode_pb2_grpc.DecodeWorkerStub(channel).Generate(
            decode_pb2.GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling), timeout=300)
        async for reply in call:
            if reply.token_ids:
                first = time.perf_counter() - start
                call.cancel()
                return first
    raise RuntimeError(f"{endpoint} returned no token")


def run(model_dir: Path, num_prompts: int, prompt_tokens: int) -> None:
    import openai  # noqa: PLC0415

    from kvmesh.runtime.launcher import MeshOptions, free_port  # noqa: PLC0415
    from kvmesh.runtime.supervisor import Mesh  # noqa: PLC0415

    budget = num_prompts * (prompt_tokens // 16 + 2)
    with tempfile.TemporaryDirectory() as run_dir:
        mesh = Mesh(MeshOptions(model=str(model_dir), port=free_port(), run_dir=run_dir, prefill=0, decode=1,
                                settings=[f"scheduler.prewarm_budget_blocks={budget}"], env={"KVMESH_TRACING": "false"}))
        mesh.start(timeout_s=300)
        try:
            client = openai.OpenAI(base_url=f"{mesh.gateway_url}/v1", api_key="x", max_retries=0, timeout=300)
            systems = [_tokens(1000 + i, prompt_tokens) for i in range(num_prompts)]
            print(f"# making {num_prompts} system prompts of {prompt_tokens} tokens hot ...", file=sys.stderr, flush=True)
            for round_ in range(3):
                for i, system in enumerate(systems):
                    client.completions.create(model="bench-llama", prompt=system + _tokens(50 * i + round_, 24),
                                              max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
            time.sleep(3.0)  # the last hand-backs reach the store, its KV events the scheduler
            scheduler = next(s for s in mesh.specs if s.service == "scheduler")
            warm = _add_decode(mesh, "decode-warm", with_store=True)
            cold = _add_decode(mesh, "decode-cold", with_store=False)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                workers = _workers(scheduler.grpc_endpoint)
                settled = _metric(scheduler.metrics_target, "kvmesh_scheduler_prewarms_total") >= 2
                if settled and all(n in workers and not workers[n].warming for n in ("decode-warm", "decode-cold")):
                    break
                time.sleep(0.2)
            blocks = _metric(scheduler.metrics_target, "kvmesh_scheduler_prewarm_blocks_total")
            seconds = _metric(scheduler.metrics_target, "kvmesh_scheduler_prewarm_seconds_sum")
            times: dict[str, list[float]] = {"warm": [], "cold": []}
            for i, system in enumerate(systems):  # alternating which worker goes first
                order = [("warm", warm), ("cold", cold)][:: 1 if i % 2 == 0 else -1]
                for label, endpoint in order:
                    times[label].append(asyncio.run(_ttft(endpoint, system + _tokens(7000 + i, 24), f"bench-{label}-{i}")))
        finally:
            mesh.stop()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nKV pre-warming (a decode worker joining a mesh with {num_prompts} hot {prompt_tokens}-token system prompts)")
    print(f"warm-up: {blocks:.0f} blocks pre-warmed in {seconds:.2f} s (scheduler's figures)")
    print(f"{'':28}{'pre-warmed':>12}{'cold':>12}{'ratio':>8}")
    print(f"{'TTFT p50, first ' + str(num_prompts) + ' requests':28}{p50['warm'] * 1e3:>10.1f}ms{p50['cold'] * 1e3:>10.1f}ms"
          f"{p50['warm'] / p50['cold']:>8.2f}   (goal <= 0.5)")
    first = times["warm"][0], times["cold"][0]
    print(f"{'TTFT, first request':28}{first[0] * 1e3:>10.1f}ms{first[1] * 1e3:>10.1f}ms{first[0] / first[1]:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=20, help="hot system prompts = requests measured per worker")
    p.add_argument("--prompt-tokens", type=int, default=960, help="tokens per system prompt")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        _, model_dir = build_llama(Path(root), **SMALL_LLAMA_BYTES)
        run(model_dir, args.prompts, args.prompt_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
