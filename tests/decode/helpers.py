"""Shared by the decode and prefill tests: tiny-model worker settings, requests, the reference engine."""

from __future__ import annotations

import os

from kvmesh.decode.config import DecodeSettings
from kvmesh.runtime.pb import common_pb2, decode_pb2
from kvmesh.worker.settings import engine_config

# NOTE: these tests run the engine on a thread unless KVMESH_DECODE_ENGINE_PROCESS says otherwise,
# although a worker's default is its own process: an engine process takes ~5 s to start on 2 cores
# (20x this folder's time). The process path has its own tests (test_engine_process.py), the decode
# conformance suite runs against both, every mesh of tests/e2e runs it (the default), and this whole
# folder passes with KVMESH_DECODE_ENGINE_PROCESS=true.
ENGINE_PROCESS = os.environ.get("KVMESH_DECODE_ENGINE_PROCESS", "false")
BLOCK_SIZE = 4
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33]  # 13 tokens: 3 blocks of KV


def decode_settings(**overrides) -> DecodeSettings:
    base = dict(
        model="tiny", nats_url="", port=0, metrics_port=-1, block_size=BLOCK_SIZE, num_kv_blocks=64,
        max_num_batched_tokens=8, max_model_len=48, drain_grace_s=0.0, prefill_timeout_s=10.0,
        engine_process=ENGINE_PROCESS,
    )
    return DecodeSettings(**{**base, **overrides})



def make_reference():
    from kvmesh.engine.llm import LLMEngine

    return LLMEngine(engine_config(decode_settings()))


def greedy(reference, prompt: list[int], max_tokens: int) -> list[int]:
    from kvmesh.engine.sampling import SamplingParams

    return reference.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))[0].token_ids


def generate_request(prompt=PROMPT, max_tokens=6, **fields) -> decode_pb2.GenerateRequest:
    sampling = common_pb2.SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, ignore_eos=True)
    return decode_pb2.GenerateRequest(prompt_token_ids=prompt, sampling=sampling, **fields)


async def collect(stub, request) -> tuple[list[int], list[decode_pb2.GenerateResponse]]:
    replies = [r async for r in stub.Generate(request, timeout=10)]
    return [t for r in replies for t in r.token_ids], replies
