"""The canary end to end: a real mesh with a production and a candidate pool, traffic mirrored by
the gateway, replayed and compared by the canary, promoted and rolled back through the scheduler."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from kvmesh.scheduler.split import draw

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

MAX_TOKENS = 8


def prompts(count: int, first: int = 0) -> list[list[int]]:
    """Distinct prompts (the canary deduplicates identical ones)."""
    return [[72, 101, 108, 108, 111, 32 + i, 44, 32, 109, 101, 115, 104] for i in range(first, first + count)]


def complete(mesh, prompt: list[int], session: str = "") -> str:
    reply = mesh.openai_client().completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True},
        extra_headers={"X-Session-Id": session} if session else None,
    )
    return reply.choices[0].text


def mirror_traffic(mesh, batch: list[list[int]]) -> list[str]:
    """Sends `batch` after a warm-up request (the gateway's mirror tap connects to NATS on its first
    sampled request and drops that one), and waits until the canary has every published record."""
    complete(mesh, prompts(1, first=200)[0])
    texts = [complete(mesh, prompt) for prompt in batch]
    published = lambda: mesh.metric("gateway", "kvmesh_gateway_mirror_published_total")  # noqa: E731
    wait_report(mesh, lambda r: published() >= len(batch) and r["mirror_received"] >= published(), "every record")
    return texts


def canary_url(mesh) -> str:
    return f"http://{mesh.spec('canary').metrics_target}"


def report(mesh) -> dict:
    return httpx.get(f"{canary_url(mesh)}/report", timeout=10).json()


def wait_report(mesh, condition, what: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = report(mesh)
        if condition(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"canary never reached {what}; last report: {body}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def shifted_model(tmp_path_factory) -> str:
    """The tiny model with its output head rolled by one row: same tokenizer, different weights."""
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    from kvmesh.engine.tiny import ensure_tiny_model  # noqa: PLC0415

    target = tmp_path_factory.mktemp("models") / "tiny-shifted"
    shutil.copytree(ensure_tiny_model(), target)
    weights = load_file(str(target / "model.safetensors"))
    weights["lm_head.weight"] = np.ascontiguousarray(np.roll(weights["lm_head.weight"], 1, axis=0))
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return str(target)


# NOTE: latency limits are loose here: on a shared 2-core CI box the candidate's replay and the
# live request run under different load; these tests judge agreement, bench/canary.py judges latency.
LOOSE_LATENCY = ["canary.max_ttft_p99_regression=20", "canary.max_tpot_p99_regression=20", "canary.latency_slack_s=2"]
NO_WARMUP = ["canary.warmup_replays=0"]  # every replay counts, so tests can count samples exactly


def test_identical_candidate_agrees_fully_passes_and_survives_bad_input(start_mesh):
    mesh = start_mesh(
        canary=True, kvstore=False, candidate_prefill=1, candidate_decode=1,
        settings=["gateway.mirror_sample=1.0", "canary.min_samples=6", "canary.noise_sample=0.5", *LOOSE_LATENCY],
    )
    # Default warm-up: the candidate's first 2 replays are run but not compared.
    mirror_traffic(mesh, prompts(8))
    body = wait_report(mesh, lambda r: r["samples"] >= 6 and r["buffered"] == 0, "6 samples")
    assert body["warmup_left"] == 0
    assert body["verdict"] == "pass", body
    assert (body["token_agreement"], body["exact_match_rate"], body["candidate_error_rate"]) == (1.0, 1.0, 0.0)
    assert body["mirror_dropped"] == 0

    # Bad input on the mirror subject: counted, dropped, the canary keeps serving.
    asyncio.run(publish_garbage(mesh))
    wait_report(mesh, lambda r: r["mirror_malformed"] >= 2, "2 malformed messages", timeout_s=30)
    assert httpx.get(f"{canary_url(mesh)}/health", timeout=10).status_code == 200
    samples = report(mesh)["samples"]
    complete(mesh, prompts(1, first=20)[0])
    wait_report(mesh, lambda r: r["samples"] > samples, "a sample after the bad input")
    assert mesh.metric("canary", "kvmesh_canary_mirror_malformed_total") >= 2
    assert mesh.metric("canary", "kvmesh_canary_verdict") == 1.0


async def publish_garbage(mesh) -> None:
    import nats  # noqa: PLC0415

    from kvmesh.runtime.bus import MIRROR_SUBJECT  # noqa: PLC0415
    from kvmesh.runtime.pb import events_pb2  # noqa: PLC0415

    inner = mesh.mesh
    client = await nats.connect(inner.nats_auth.url("gateway", inner.opts.host, inner.nats_port))
    await client.publish(MIRROR_SUBJECT, b"\xff\xfe not a protobuf")
    await client.publish(MIRROR_SUBJECT, events_pb2.MirrorRecord(request_id="no-prompt").SerializeToString())
    await client.flush()
    await client.close()


def test_different_weights_fail_then_promote_and_rollback_move_production(start_mesh, shifted_model):
    mesh = start_mesh(
        canary=True, kvstore=False, candidate_prefill=1, candidate_decode=1, candidate_model=shifted_model,
        settings=["gateway.mirror_sample=1.0", "canary.min_samples=4", "canary.noise_sample=0.5", *LOOSE_LATENCY,
                  *NO_WARMUP],
    )
    probe = prompts(1, first=40)[0]
    [production_text] = mirror_traffic(mesh, [probe])
    mirror_traffic(mesh, prompts(4))
    body = wait_report(mesh, lambda r: r["samples"] >= 4, "4 samples")
    assert body["verdict"] == "fail", body
    assert body["token_agreement"] < 0.5
    assert body["noise_floor_agreement"] == 1.0
    assert "token agreement" in body["reason"]
    assert mesh.metric("canary", "kvmesh_canary_verdict") == 2.0

    # A stepwise promote: the candidate serves the sessions whose draw falls under 0.5.
    stepped = httpx.post(f"{canary_url(mesh)}/promote", json={"weight": 0.5}, timeout=30).json()
    assert stepped == {"production_pool": "production", "candidate_pool": "candidate", "promoted_weight": 0.5}
    sessions = [f"user-{i}" for i in range(12)]
    on_candidate = [s for s in sessions if draw(s) < 0.5]
    assert 0 < len(on_candidate) < len(sessions)
    texts = {s: complete(mesh, probe, session=s) for s in sessions}
    assert {s for s, text in texts.items() if text != production_text} == set(on_candidate)
    [candidate_text] = {texts[s] for s in on_candidate}
    wait_report(mesh, lambda r: r["mirror_candidate_served"] == len(on_candidate), "candidate-served records counted")

    promoted = httpx.post(f"{canary_url(mesh)}/promote", timeout=30).json()
    assert promoted == {"production_pool": "candidate", "candidate_pool": "production", "promoted_weight": 0.0}
    candidate_requests = mesh.metric("decode-candidate-0", "kvmesh_decode_requests_total")
    assert complete(mesh, probe) == candidate_text
    assert mesh.metric("decode-candidate-0", "kvmesh_decode_requests_total") > candidate_requests

    rolled_back = httpx.post(f"{canary_url(mesh)}/rollback", timeout=30).json()
    assert rolled_back == {"production_pool": "production", "candidate_pool": "candidate", "promoted_weight": 0.0}
    assert complete(mesh, probe) == production_text


def test_slow_candidate_leaves_production_alone_and_drops_are_counted(start_mesh):
    mesh = start_mesh(
        canary=True, kvstore=False, candidate_prefill=1, candidate_decode=1,
        candidate_settings=["decode.step_delay_s=0.5"],
        settings=["gateway.mirror_sample=1.0", "canary.max_concurrency=1", "canary.buffer_max_records=2",
                  "canary.noise_sample=0", "canary.min_samples=3", *NO_WARMUP],
    )
    # The candidate pool and the canary run on idle CPU only; production keeps its priority.
    if hasattr(os, "SCHED_IDLE"):
        idle = {name: os.sched_getscheduler(mesh.pid(name)) == os.SCHED_IDLE
                for name in ("decode-0", "prefill-0", "gateway", "decode-candidate-0", "prefill-candidate-0", "canary")}
        assert idle == {"decode-0": False, "prefill-0": False, "gateway": False,
                        "decode-candidate-0": True, "prefill-candidate-0": True, "canary": True}
    complete(mesh, prompts(1, first=200)[0])
    texts = [complete(mesh, prompt) for prompt in prompts(10)]
    assert len(set(texts)) > 1
    # Production finished all ten while the slow candidate has replayed only a few of them.
    body = report(mesh)
    assert body["samples"] < 10
    assert body["mirror_dropped"] >= 1
    assert mesh.metric("canary", "kvmesh_canary_mirror_dropped_total") >= 1
    body = wait_report(mesh, lambda r: r["samples"] >= 3, "3 slow samples")
    assert body["token_agreement"] == 1.0
    assert body["tpot"]["candidate_p50_s"] > body["tpot"]["production_p50_s"]
    assert body["verdict"] == "fail" and "p99" in body["reason"]
