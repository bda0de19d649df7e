"""KV reuse across the mesh: local prefix cache, the KV store, multi-turn hand-back, int8 pushes."""

from __future__ import annotations

import os
import signal

import pytest

from kvmesh.runtime.registry_client import list_workers

from .polling import eventually

pytestmark = pytest.mark.e2e

LONG_PROMPT = [33 + (i * 11) % 90 for i in range(200)]  # 12 full blocks: long enough for remote prefill



def _complete(handle, prompt, max_tokens=16):
    reply = handle.openai_client().completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                      temperature=0, extra_body={"ignore_eos": True})
    return reply.choices[0].text, reply.usage


def test_second_identical_request_hits_the_decode_workers_cache(mesh):
    prompt = [34 + (i * 7) % 80 for i in range(150)]
    hits_before = mesh.metric("decode-0", "kvmesh_decode_prefix_hit_tokens_total")
    cold_text, cold_usage = _complete(mesh, prompt)
    warm_text, warm_usage = _complete(mesh, prompt)
    assert warm_text == cold_text
    assert eventually(lambda: mesh.metric("decode-0", "kvmesh_decode_prefix_hit_tokens_total") - hits_before >= 144)
    assert warm_usage.prompt_tokens_details.cached_tokens >= 144


def test_second_turn_of_a_chat_starts_from_the_handed_back_kv(mesh):
    client = mesh.openai_client()
    turn1 = [{"role": "user", "content": "Tell me a long story about a mesh of workers. " * 3}]
    first = client.chat.completions.create(model="tiny", messages=turn1, max_tokens=40, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
    assert eventually(lambda: mesh.metric("decode-0", "kvmesh_decode_kv_handback_blocks_total") > 0)
    second = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=8, temperature=0)
    # The first turn's prompt and most of its completion are already cached.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_fresh_workers_get_the_prefix_from_the_store(start_mesh):
    """The first request's prefill worker is drained and round robin sends the repeat to the
    other decode worker: both caches on the new path are cold, so the prefix must come from the
    KV store (handed back by the first decode worker) — and the output must not change."""
    handle = start_mesh(prefill=2, decode=2, kvstore=True, policy="round_robin")
    cold_text, _ = _complete(handle, LONG_PROMPT)
    assert eventually(lambda: handle.metric("kvstore", "kvmesh_kvstore_put_bytes_total") > 0)
    used = "prefill-0" if handle.metric("prefill-0", "kvmesh_prefill_requests_total") else "prefill-1"
    os.kill(handle.pid(used), signal.SIGTERM)
    scheduler = handle.spec("scheduler").grpc_endpoint
    assert eventually(lambda: used not in list_workers(scheduler))
    warm_text, _ = _complete(handle, LONG_PROMPT)
    assert warm_text == cold_text
    assert handle.metric("kvstore", "kvmesh_kvstore_lookup_hit_blocks_total") >= 12
    fresh = "prefill-1" if used == "prefill-0" else "prefill-0"
    assert handle.metric(fresh, "kvmesh_prefill_cached_tokens_total", source="store") >= 12 * 16


def test_int8_pushes_halve_the_bytes_and_keep_greedy_output(start_mesh):
    handle = start_mesh(prefill=1, decode=1, kvstore=False, settings=["decode.kv_encoding=int8"])
    text, _ = _complete(handle, LONG_PROMPT, max_tokens=8)
    assert handle.metric("decode-0", "kvmesh_decode_kv_blocks_received_total", encoding="int8") >= 12
    int8_bytes = handle.metric("decode-0", "kvmesh_decode_kv_bytes_received_total", encoding="int8")
    raw_fp32_bytes = 12.4375 * 16 * 2 * 2 * 2 * 16 * 4  # ≈ 199 tokens x [2, L=2, H=2, D=16] x 4 bytes (fp32)
    assert int8_bytes <= raw_fp32_bytes / 2
    assert len(text) > 0
