"""Automatic canary rollout end to end: real meshes with a production and a candidate pool, the
gateway mirroring every request, the canary stepping the candidate's share of production traffic
and judging each step. Windows are short (a few samples) to keep the tests fast."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import grpc
import httpx
import openai
import pytest

from kvmesh.runtime.pb import scheduler_pb2, scheduler_pb2_grpc

from .test_canary import NO_WARMUP, canary_url, shifted_model  # noqa: F401 - the fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ADMIN = {"Authorization": "Bearer s3cret"}
BASE = ["gateway.mirror_sample=1.0", "canary.noise_sample=0.3", "canary.rollout_tick_s=0.2", "canary.admin_key=s3cret",
        *NO_WARMUP]
_serial = itertools.count()


def next_prompt() -> list[int]:
    """A prompt no earlier request had (the canary deduplicates identical ones)."""
    i = next(_serial)
    return [72, 101, 108, 32 + i % 90, 32 + i // 90, 44, 32, 109, 101, 115, 104, 33]


def rollout(mesh) -> dict:
    return httpx.get(f"{canary_url(mesh)}/rollout", timeout=10).json()


def drive(mesh, done, what: str, timeout_s: float = 180.0) -> dict:
    """Sends production requests one at a time until `done(GET /rollout)`; requests the candidate
    fails are part of the test, so client errors are tolerated."""
    client = mesh.openai_client()
    deadline = time.monotonic() + timeout_s
    while not done(body := rollout(mesh)):
        if time.monotonic() > deadline:
            raise AssertionError(f"rollout never reached {what}; last: {body}")
        try:
            client.completions.create(model="tiny", prompt=next_prompt(), max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
        except openai.APIError:
            pass
    return body


def kvmesh_canary(mesh, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVMESH_CANARY_ADMIN_KEY": "s3cret"}
    return subprocess.run([sys.executable, "-m", "kvmesh", "canary", "rollout", *args, "--url", canary_url(mesh)],
                          capture_output=True, text=True, timeout=60, env=env)


def production_split(mesh) -> tuple[str, str, float]:
    with grpc.insecure_channel(mesh.spec("scheduler").grpc_endpoint) as channel:
        reply = scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=10)
    return reply.production_pool, reply.canary_pool, reply.canary_weight


def test_identical_candidate_rolls_out_to_1_across_a_canary_killed_and_restarted(start_mesh):
    mesh = start_mesh(canary=True, kvstore=False, prefill=0, candidate_decode=1, settings=BASE)
    assert httpx.post(f"{canary_url(mesh)}/rollout", json={"steps": [0.2, 1]}, timeout=10).status_code == 401
    started = kvmesh_canary(mesh, "start", "--steps", "0.2,0.5,1.0", "--min-samples", "3")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("rollout running at step 1")
    assert production_split(mesh) == ("production", "candidate", pytest.approx(0.2))

    drive(mesh, lambda r: r["step"] == 2 and r["applied"], "step 2")
    mesh.mesh.restart("canary")  # SIGKILL mid-rollout, then the same command again
    body = rollout(mesh)
    assert (body["state"], body["step"], body["resumed"]) == ("running", 2, 1)
    assert body["steps"][0]["state"] == "passed"

    body = drive(mesh, lambda r: r["state"] != "running" and r["applied"], "the end")
    assert (body["state"], body["weight"]) == ("completed", 1.0), body
    assert [s["state"] for s in body["steps"]] == ["passed"] * 3
    assert production_split(mesh) == ("candidate", "", 0.0)
    # The candidate runs at idle CPU priority (kvmesh up's default): latency is shown, not judged.
    assert body["latency_comparable"] is False
    assert "latency not comparable" in body["steps"][0]["reason"]
    status = kvmesh_canary(mesh, "status")
    assert status.returncode == 0 and "rollout completed" in status.stdout and "n/c  TTFT p99" in status.stdout
    assert mesh.metric("canary", "kvmesh_canary_rollout_state") == 2.0
    assert mesh.metric("canary", "kvmesh_canary_rollout_step_verdict", step="2") == 2.0


def test_different_weights_are_rolled_back_at_the_first_step_on_agreement(start_mesh, shifted_model):
    mesh = start_mesh(canary=True, kvstore=False, prefill=0, candidate_decode=1, candidate_model=shifted_model,
                      settings=BASE)
    reply = httpx.post(f"{canary_url(mesh)}/rollout", json={"steps": [0.2, 0.5, 1.0], "min_samples": 3},
                       headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text
    body = drive(mesh, lambda r: r["state"] != "running" and r["applied"], "a verdict")
    assert (body["state"], body["step"], body["weight"]) == ("rolled_back", 1, 0.0), body
    assert body["reason"].startswith("step 1 (0.2) failed: token agreement "), body["reason"]
    [agreement] = [c for c in body["steps"][0]["checks"] if c["name"] == "token_agreement"]
    assert agreement["value"] < 0.5 and not agreement["passed"]
    assert production_split(mesh) == ("production", "", 0.0)
    assert mesh.metric("canary", "kvmesh_canary_rollout_state") == 3.0


def test_an_erroring_candidate_is_rolled_back(start_mesh):
    # The candidate's context is shorter than every prompt: each request it gets fails.
    mesh = start_mesh(canary=True, kvstore=False, prefill=0, candidate_decode=1, settings=BASE,
                      candidate_settings=["decode.max_model_len=8"])
    httpx.post(f"{canary_url(mesh)}/rollout", json={"steps": [0.2, 1.0], "min_samples": 3}, headers=ADMIN, timeout=10)
    body = drive(mesh, lambda r: r["state"] != "running" and r["applied"], "a verdict")
    assert (body["state"], body["step"]) == ("rolled_back", 1), body
    assert "error rate 1.000 vs production 0.000" in body["reason"], body["reason"]
    assert production_split(mesh) == ("production", "", 0.0)
