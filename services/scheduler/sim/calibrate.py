"""Measures the simulator's engine cost model on the in-process engine (`kvmesh.engine.llm`).

`python -m kvmesh.scheduler.sim.calibrate [--model tiny] [--device cpu] [--threads 1]` prints
prefill seconds per token (slope of prefill time over prompt length) and decode seconds per step
(intercept and per-sequence slope of step time over batch size), ready to pass to `kvmesh sim`.
These are a LOWER BOUND on a mesh's costs (no HTTP, gRPC, routing or RPC loop); for a running
mesh use `kvmesh sim calibrate --url GATEWAY` (meshprobe.py), which measures it end to end.
"""

from __future__ import annotations

import argparse
import statistics
import time


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = a + b·x; returns (a, b)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def measure(model: str, device: str, repeats: int = 3) -> dict[str, float]:
    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415 - torch only here
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415

    engine = LLMEngine(EngineConfig(model=model, device=device, enable_prefix_caching=False, max_num_seqs=64))
    vocab = min(256, engine.model_args.vocab_size)
    max_len = min(engine.max_model_len - 8, 1536)
    counter = iter(range(10**9))

    def run(prompts: list[list[int]], max_tokens: int) -> list[float]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for prompt in prompts:
            engine.add_request(f"cal-{next(counter)}", prompt, params)
        steps = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - start)
        return steps

    run([[1] * 32], 2)  # warm-up
    prefill = []
    for length in (max_len // 4, max_len // 2, max_len):
        for r in range(repeats):
            prompt = [(7 * i + r) % vocab for i in range(length)]
            prefill.append((length, run([prompt], 1)[0]))
    decode = []
    for batch in (1, 8, 32, 64):
        steps = run([[(i + j) % vocab for i in range(16)] for j in range(batch)], 33)
        decode.append((batch, statistics.median(steps[2:])))  # skip the prefill steps
    _, per_token = fit_line(prefill)
    base, per_seq = fit_line(decode)
    return {"prefill_s_per_token": per_token, "decode_s_per_step": base, "decode_s_per_seq": per_seq}


def lower_bound(model: str, device: str = "cpu", threads: int = 1) -> dict[str, float]:
    """`measure` with `threads` torch threads: the in-process engine's costs, a lower bound on a mesh's."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(threads)
    return measure(model, device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvmesh.scheduler.sim.calibrate", description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = lower_bound(args.model, args.device, args.threads)
    print("# in-process engine only: a lower bound on a mesh's costs (see `kvmesh sim calibrate --url`)")
    for name, value in result.items():
        print(f"--{name.replace('_', '-')} {value:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
