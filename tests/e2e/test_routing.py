"""Routing on a real mesh: KV-aware affinity, round-robin spread, dead workers, overload."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import psutil
import pytest

from kvmesh.runtime.registry_client import list_workers

from .polling import eventually

pytestmark = pytest.mark.e2e

SHARED = [40 + (i * 13) % 80 for i in range(160)]  # 10 full blocks every request below shares



def _served(handle) -> dict[str, float]:
    return {w: handle.metric(w, "kvmesh_decode_requests_total") for w in ("decode-0", "decode-1")}


def _send_shared_prefix_requests(handle, count: int) -> dict[str, float]:
    client = handle.openai_client()
    before = _served(handle)
    for i in range(count):
        client.completions.create(model="tiny", prompt=SHARED + [100 + i] * 20, max_tokens=2, temperature=0)
    return {w: n - before[w] for w, n in _served(handle).items()}


def test_kv_aware_sends_a_shared_prefix_to_the_warm_worker(start_mesh):
    handle = start_mesh(prefill=1, decode=2, kvstore=False, policy="kv_aware")
    warm = _send_shared_prefix_requests(handle, 1)
    warm_worker = max(warm, key=warm.get)
    time.sleep(1.0)  # KV events reach the scheduler's index
    spread = _send_shared_prefix_requests(handle, 6)
    assert spread[warm_worker] == 6, spread


def test_round_robin_spreads_the_same_requests(start_mesh):
    handle = start_mesh(prefill=1, decode=2, kvstore=False, policy="round_robin")
    spread = _send_shared_prefix_requests(handle, 6)
    assert spread == {"decode-0": 3, "decode-1": 3}


def test_a_killed_worker_stops_receiving_requests(start_mesh):
    handle = start_mesh(prefill=0, decode=2, kvstore=False, policy="round_robin")
    scheduler = handle.spec("scheduler").grpc_endpoint
    os.kill(handle.pid("decode-1"), signal.SIGKILL)
    assert eventually(lambda: "decode-1" not in list_workers(scheduler), timeout_s=8)
    client = handle.openai_client()
    before = handle.metric("decode-0", "kvmesh_decode_requests_total")
    for _ in range(4):
        assert client.completions.create(model="tiny", prompt="still here", max_tokens=2).usage.completion_tokens == 2
    assert handle.metric("decode-0", "kvmesh_decode_requests_total") - before == 4


async def test_overload_answers_429_with_retry_after_and_never_5xx(start_mesh):
    handle = start_mesh(prefill=0, decode=1, kvstore=False,
                        settings=["decode.max_num_seqs=2", "scheduler.admission_queue_factor=1"])
    body = {"model": "tiny", "prompt": "overload " * 4, "max_tokens": 200, "ignore_eos": True}
    gateway = psutil.Process(handle.pid("gateway"))
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=120) as client:
        await client.post("/v1/completions", json={**body, "max_tokens": 2})  # warm up before measuring memory
        rss_before = gateway.memory_info().rss
        for _ in range(3):  # 40 concurrent requests against room for 4 (2 running + 2 queued), three times
            replies = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(40)))
    assert gateway.memory_info().rss - rss_before < 64 * 2**20  # flat: rejected requests hold nothing
    statuses = [r.status_code for r in replies]
    assert all(s < 500 for s in statuses), statuses
    assert statuses.count(200) >= 2 and statuses.count(429) >= 20, statuses
    rejected = next(r for r in replies if r.status_code == 429)
    assert float(rejected.headers["retry-after"]) > 0
    assert rejected.json()["error"]["type"]
