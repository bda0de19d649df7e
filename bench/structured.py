"""Structured-output cost: engine throughput with `json_schema` on, divided by the same requests
without it, on the ~22M-param random Llama (byte-level vocabulary), measured in one run.

    .venv/bin/python bench/structured.py [--batch 8] [--max-tokens 128] [--rounds 3]

Each round runs the batch twice: once with a JSON schema (the grammar masks every step and
advances per token) and once unconstrained with each request's max_tokens set to the length its
constrained twin produced (EOS ignored), so both runs generate exactly the same number of tokens
from the same prompts. Throughput = generated tokens / wall time; best of interleaved rounds, so
load from other processes hits both sides alike. Goal: ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from checkpoints import SMALL_LLAMA_BYTES, build_llama

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 32},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "email", "tags", "active", "role"],
    "additionalProperties": False,
}


def prompts(n: int) -> list[list[int]]:
    return [[256] + list(f"Describe user number {i} as JSON: ".encode()) for i in range(n)]


def run(engine: LLMEngine, batch: list[list[int]], params: list[SamplingParams]) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out = engine.generate(batch, params)
    return time.perf_counter() - t0, [len(c.token_ids) for c in out]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128, help="cap per request (a random model's JSON strings run long)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvmesh-bench-structured-"))
    try:
        _, path = build_llama(tmp, **SMALL_LLAMA_BYTES)
        engine = LLMEngine(EngineConfig(model=str(path), max_num_seqs=args.batch))
        batch = prompts(args.batch)
        spec = ("json", json.dumps(SCHEMA))
        constrained = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, structured=spec) for i in range(args.batch)]
        run(engine, batch[:2], constrained[:2])  # warm-up (compiles the grammar once; the cache keeps it)
        best_on = best_off = float("inf")
        tokens = 0
        for _ in range(args.rounds):
            elapsed_on, lengths = run(engine, batch, constrained)
            plain = [SamplingParams(temperature=1.0, seed=i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
            elapsed_off, plain_lengths = run(engine, batch, plain)
            if plain_lengths != lengths:
                raise RuntimeError("the unconstrained run did not generate the same number of tokens")
            tokens = sum(lengths)
            best_on, best_off = min(best_on, elapsed_on), min(best_off, elapsed_off)
        on, off = tokens / best_on, tokens / best_off
        print(f"batch {args.batch}, {tokens} generated tokens per run, best of {args.rounds} interleaved rounds")
        print(f"  json_schema on : {on:8.1f} tok/s")
        print(f"  json_schema off: {off:8.1f} tok/s")
        print(f"  ratio (on / off): {on / off:.3f}   (goal >= 0.9)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
