"""Prefix reuse, measured in one run.

    .venv/bin/python bench/prefix.py [--rounds 5]

1. TTFT through the full mesh (gateway → scheduler → prefill → KV push → decode) for a ~2k-token
   prompt whose first ~1.9k tokens are cached vs a cold ~2k-token prompt, on a ~22M-parameter
   random Llama (goal: cached ≤ 25% of cold).
2. KV store Put/Get throughput over gRPC vs raw loopback TCP (bench/prefix_store.py).
3. Bytes per block raw vs int8 vs int4, and int8/int4 quality: greedy agreement over a set of
   prompts and the relative error of the first token's top-20 logprobs vs raw KV.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import prefix_store
from checkpoints import SMALL_LLAMA_BYTES, build_llama

PROMPT_TOKENS = 1984
CACHED_TOKENS = 1904


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 256 for i in range(length)]


def ttft(client, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    for chunk in client.completions.create(model="bench-llama", prompt=prompt, max_tokens=2, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].text is not None:
            return time.perf_counter() - t0
    return time.perf_counter() - t0


def mesh_ttft(model_dir: Path, rounds: int) -> tuple[list[float], list[float]]:
    import openai  # noqa: PLC0415

    from kvmesh.runtime.launcher import MeshOptions, free_port  # noqa: PLC0415
    from kvmesh.runtime.supervisor import Mesh  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as run_dir:
        mesh = Mesh(MeshOptions(model=str(model_dir), port=free_port(), run_dir=run_dir, prefill=1, decode=1,
                                env={"KVMESH_TRACING": "false"}))
        mesh.start(timeout_s=300)
        try:
            client = openai.OpenAI(base_url=f"{mesh.gateway_url}/v1", api_key="x", max_retries=0, timeout=300)
            shared = _prompt(0, CACHED_TOKENS)
            ttft(client, _prompt(999, 64))          # warm up every process
            ttft(client, shared + _prompt(1, 80))    # puts the shared prefix in the caches
            cold, cached = [], []
            for r in range(rounds):                  # interleaved, so noise hits both alike
                cold.append(ttft(client, _prompt(100 + r, PROMPT_TOKENS)))
                cached.append(ttft(client, shared + _prompt(200 + r, PROMPT_TOKENS - CACHED_TOKENS)))
            return cold, cached
        finally:
            mesh.stop()


def kv_quality(model_dir: Path, prompts: int = 8, new_tokens: int = 32) -> dict[str, tuple[float, float, int]]:
    """{encoding: (greedy agreement, relative top-20 logprob error, bytes per block)}."""
    import torch  # noqa: PLC0415

    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415
    from kvmesh.runtime import kvwire  # noqa: PLC0415
    from kvmesh.worker import kvtensor  # noqa: PLC0415

    producer = LLMEngine(EngineConfig(model=str(model_dir), dtype="bfloat16"))
    spec = kvwire.model_spec("bench", producer.model_args, "bfloat16", producer.block_size)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, logprobs=20)

    def run(prompt: list[int], kv) -> tuple[list[int], dict[int, float]]:
        consumer = LLMEngine(EngineConfig(model=str(model_dir), dtype="bfloat16"))
        consumer.add_request("q", prompt, params, computed_kv=kv)
        tokens, first = [], None
        while consumer.has_unfinished_requests():
            for out in consumer.step():
                tokens += out.new_token_ids
                if first is None and out.logprobs:
                    first = dict(out.logprobs[0].top_logprobs)
        return tokens, first

    def roundtrip(kv, encoding: int):
        bs = producer.block_size
        blocks = [kvtensor.encode_block(kv[:, :, s:s + bs].contiguous(), encoding=encoding)
                  for s in range(0, kv.shape[2], bs)]
        return torch.cat([kvtensor.decode_block(b, spec) for b in blocks], dim=2), kvwire.wire_bytes(blocks[0])

    results = {}
    for name in ("raw", "int8", "int4"):
        agree, errors, block_bytes = [], [], 0
        for i in range(prompts):
            prompt = _prompt(300 + i, 200)
            producer.add_request(f"p{i}{name}", prompt, params, prefill_only=True)
            while producer.has_unfinished_requests():
                producer.step()
            kv = producer.export_kv(f"p{i}{name}", 0, len(prompt) - 1)
            producer.release(f"p{i}{name}")
            ref_tokens, ref_first = run(prompt, kv)
            moved, block_bytes = roundtrip(kv, kvwire.encoding_from_name(name))
            tokens, first = run(prompt, moved)
            agree.append(sum(a == b for a, b in zip(tokens, ref_tokens)) / len(ref_tokens))
            common = [t for t in ref_first if t in first]  # top-20 ids both runs returned
            ref = torch.tensor([ref_first[t] for t in common])
            errors.append(float((torch.tensor([first[t] for t in common]) - ref).norm() / ref.norm()))
        results[name] = (statistics.mean(agree), statistics.mean(errors), block_bytes)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        _, model_dir = build_llama(Path(tmp), **SMALL_LLAMA_BYTES)
        cold, cached = mesh_ttft(model_dir, args.rounds)
        print(f"\n1) TTFT through the mesh, {PROMPT_TOKENS}-token prompts, ~22M-param Llama (median of {args.rounds})")
        print(f"   cold                      {statistics.median(cold) * 1e3:8.1f} ms")
        print(f"   {CACHED_TOKENS} tokens cached       {statistics.median(cached) * 1e3:8.1f} ms")
        print(f"   cached / cold             {statistics.median(cached) / statistics.median(cold):8.2f}  (goal ≤ 0.25)")
        print("\n2) KV store throughput vs raw loopback TCP")
        asyncio.run(prefix_store.run(prefix_store.parse_args([])))
        print("\n3) KV encodings (bfloat16 model; greedy agreement and logprob error vs raw KV, 8 prompts x 32 tokens)")
        quality = kv_quality(model_dir)
        raw_bytes = quality["raw"][2]
        for name, (agreement, error, block_bytes) in quality.items():
            print(f"   {name:5} {block_bytes:8d} bytes/block ({block_bytes / raw_bytes:5.2f} of raw)  "
                  f"greedy agreement {agreement:6.1%}  top-20 logprob rel. error {error:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
