"""Does mirroring to a slow candidate slow production down? One command, one run:

    .venv/bin/python bench/canary.py [--requests 200] [--concurrency 4] [--prompt-tokens 64] [--max-tokens 16]

Runs the same workload through two meshes that differ only in the gateway's mirror sample:
(A) mirroring off; (B) 100% of requests mirrored to a canary whose candidate pool is made
`--slowdown` times slower (the decode worker's `step_delay_s` test setting, sized from A's measured
time per output token). Prints production TTFT p50/p99 for both, the p99 ratio B/A (goal: within
5%), and what the canary did in B (replayed, dropped, verdict). Ratios, not absolute numbers, are
the result: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Phase:
    name: str
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    canary: dict = field(default_factory=dict)
    gateway_mirror_dropped: float = 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


def make_prompts(n: int, length: int, salt: int) -> list[list[int]]:
    # NOTE: distinct prompts, so the canary's dedup never hides a mirrored request.
    return [[32 + (salt * 31 + i * 7 + j * 13 + (i * j) % 17) % 90 for j in range(length)] for i in range(n)]


def missing_prerequisite() -> str | None:
    if importlib.util.find_spec("kvmesh.runtime.supervisor") is None:
        return "the mesh launcher (kvmesh.runtime.supervisor) is not there yet"
    from kvmesh.decode.config import DecodeSettings

    if "step_delay_s" not in DecodeSettings.model_fields:
        return "the decode worker has no step_delay_s setting (KVMESH_DECODE_STEP_DELAY_S) to slow a candidate down"
    return None


def metric(url: str, name: str) -> float:
    import httpx

    total = 0.0
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_phase(phase: Phase, prompts: list[list[int]], args: argparse.Namespace, mirror: float, step_delay_s: float) -> Phase:
    import httpx
    import openai

    from kvmesh.runtime.launcher import MeshOptions, free_port
    from kvmesh.runtime.supervisor import Mesh

    settings = [f"gateway.mirror_sample={mirror}", "canary.noise_sample=0"]
    with tempfile.TemporaryDirectory() as run_dir:
        opts = MeshOptions(
            port=free_port(), run_dir=run_dir, kvstore=False, canary=True, candidate_prefill=1, candidate_decode=1,
            settings=settings, candidate_settings=[f"decode.step_delay_s={step_delay_s}"],
            env={"KVMESH_TRACING": "false"},
        )
        mesh = Mesh(opts)
        mesh.start(timeout_s=180)
        try:
            client = openai.OpenAI(base_url=f"{mesh.gateway_url}/v1", api_key="x", max_retries=0, timeout=300)
            for warm in make_prompts(4, args.prompt_tokens, salt=999):
                client.completions.create(model="tiny", prompt=warm, max_tokens=4, temperature=0)
            lock = threading.Lock()

            def one(prompt: list[int]) -> None:
                start = time.perf_counter()
                stamps: list[float] = []
                for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=args.max_tokens,
                                                       temperature=0, stream=True, extra_body={"ignore_eos": True}):
                    if chunk.choices and chunk.choices[0].text:
                        stamps.append(time.perf_counter())
                with lock:
                    phase.ttfts.append(stamps[0] - start)
                    if len(stamps) > 1:
                        phase.tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))

            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(one, prompts))
            canary = next(s for s in mesh.specs if s.service == "canary")
            phase.canary = httpx.get(f"http://{canary.metrics_target}/report", timeout=10).json()
            phase.gateway_mirror_dropped = metric(f"{mesh.gateway_url}/metrics", "kvmesh_gateway_mirror_dropped_total")
        finally:
            mesh.stop()
    return phase


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--slowdown", type=float, default=10.0, help="how many times slower the candidate decodes")
    p.add_argument("--rounds", type=int, default=2, help="mirrored phases, alternating with unmirrored ones")
    args = p.parse_args(argv)
    reason = missing_prerequisite()
    if reason:
        print(f"bench/canary.py skipped: {reason}")
        return 0
    started = time.perf_counter()
    off = run_phase(Phase("mirroring off"), make_prompts(args.requests, args.prompt_tokens, 1), args, 0.0, 0.0)
    step_s = statistics.median(off.tpots) if off.tpots else 0.01
    delay_s = round(step_s * (args.slowdown - 1), 4)
    on = Phase(f"100% mirrored, candidate {args.slowdown:g}x slower")
    # NOTE: phases alternate (off, on, off, on, ...) and pool their samples, so drift in the
    # machine's load hits both alike.
    for r in range(args.rounds):
        if r > 0:
            run_phase(off, make_prompts(args.requests, args.prompt_tokens, 100 + r), args, 0.0, 0.0)
        run_phase(on, make_prompts(args.requests, args.prompt_tokens, 2 + r), args, 1.0, delay_s)
    print(f"\n{args.requests} requests, {args.prompt_tokens} prompt tokens, {args.max_tokens} output tokens, "
          f"concurrency {args.concurrency}, tiny model; candidate step delay {delay_s * 1e3:.1f} ms "
          f"(production step {step_s * 1e3:.1f} ms)\n")
    print(f"{'production traffic':44} {'TTFT p50 ms':>12} {'p99 ms':>8}")
    for phase in (off, on):
        print(f"{phase.name:44} {phase.pct(0.5) * 1e3:12.1f} {phase.pct(0.99) * 1e3:8.1f}")
    ratio = on.pct(0.99) / off.pct(0.99)
    verdict = "within" if abs(ratio - 1) <= 0.05 else "NOT within"
    print(f"\nTTFT p99 ratio mirrored / off = {ratio:.3f} ({verdict} the 5% goal)")
    c = on.canary
    print(f"canary in the mirrored run: received {c.get('mirror_received')}, replayed {c.get('samples')}, "
          f"dropped {c.get('mirror_dropped')} (gateway tap dropped {on.gateway_mirror_dropped:g}), "
          f"verdict {c.get('verdict')}: {c.get('reason')}")
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
