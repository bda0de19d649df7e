"""The gateway's detokenization, byte table against DecodeStream, side by side in one run.

    .venv/bin/python bench/detok.py [--model tiny|DIR] [--requests 32] [--chunk 8] [--rounds 5]

Makes each request's text the gateway's way (`TextAssembler`: a request's tokens arrive a chunk
at a time, the first one alone, as the worker's stream interval sends them) over the same token
streams twice: with the tokenizer's byte table (`engine/bytelevel.py`), and with the table turned
off, so `tokenizers`' DecodeStream does the work as before. Two streams: the in-process engine's
greedy output for bench/tokcost.py's prompts (on `tiny`, random bytes: a character is split across
tokens in many chunks), and English-and-Unicode text encoded by the tokenizer. Prints µs per token
of each path (the best of `--rounds`) and their ratio; the texts must match.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tokcost  # noqa: E402

from kvmesh.engine.tokenizer import Tokenizer  # noqa: E402
from kvmesh.gateway.text import TextAssembler  # noqa: E402

_TEXT = ("The sky is blue because air scatters short wavelengths more (Rayleigh scattering). "
         "Ünïcödé, 世界 and 🙂 go by too.\n\n") * 6


def assemble(tok: Tokenizer, prompt: list[int], ids: list[int], chunk: int) -> str:
    asm = TextAssembler(tok, prompt, ())
    parts = [asm.add(ids[:1])[0]]
    parts += [asm.add(ids[i : i + chunk])[0] for i in range(1, len(ids), chunk)]
    return "".join(parts) + asm.finish()


def best_us_per_token(tok: Tokenizer, streams: list[tuple[list[int], list[int]]], chunk: int, rounds: int) -> tuple[float, list[str]]:
    best, texts = float("inf"), []
    tokens = sum(len(ids) for _, ids in streams)
    for _ in range(rounds):
        t0 = time.perf_counter()
        texts = [assemble(tok, prompt, ids, chunk) for prompt, ids in streams]
        best = min(best, (time.perf_counter() - t0) / tokens * 1e6)
    return best, texts


def engine_streams(model: str, tok: Tokenizer, requests: int) -> list[tuple[list[int], list[int]]]:
    from kvmesh.engine.llm import EngineConfig, LLMEngine
    from kvmesh.engine.sampling import SamplingParams

    prompts = [tokcost._chat_ids(tok, tokcost.messages(i)) for i in range(requests)]  # noqa: SLF001
    engine = LLMEngine(EngineConfig(model=model))
    done = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True))
    return [(p, list(c.token_ids)) for p, c in zip(prompts, done)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--chunk", type=int, default=8, help="tokens a delta carries (the worker's stream_interval)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    from kvmesh.engine.tiny import resolve_model

    table_tok = Tokenizer.from_dir(resolve_model(args.model))
    stream_tok = Tokenizer.from_dir(resolve_model(args.model))
    stream_tok._byte_tables = {True: None, False: None}  # noqa: SLF001 - DecodeStream, as before the table
    if table_tok.byte_table() is None:
        print(f"{args.model}: not a byte-level BPE tokenizer; both paths are DecodeStream")
    text = table_tok.encode(_TEXT, add_special_tokens=False)
    prompt = table_tok.encode("Why is the sky blue?", add_special_tokens=False)
    for name, streams in (("engine output", engine_streams(args.model, table_tok, args.requests)),
                          ("encoded text", [(prompt, text)] * args.requests)):
        new, new_texts = best_us_per_token(table_tok, streams, args.chunk, args.rounds)
        old, old_texts = best_us_per_token(stream_tok, streams, args.chunk, args.rounds)
        same = "same text" if new_texts == old_texts else "TEXTS DIFFER"
        print(f"{name}: byte table {new:.2f} µs/token, DecodeStream {old:.2f} µs/token, table / stream {new / old:.2f}x ({same})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
