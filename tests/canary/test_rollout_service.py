"""The automatic rollout in process: real nats-server, fake scheduler and decode workers on loopback."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from kvmesh.canary.service import CanaryService
from kvmesh.runtime.pb import canary_pb2

from .harness import Harness, eventually, start_canary  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)

FAST = dict(rollout_tick_s=0.05, min_samples=2)
ROLLOUT = {"steps": [0.25, 0.5, 1.0], "min_samples": 2}
_first = itertools.count(0, 10)


async def rollout(h: Harness) -> dict:
    return (await h.http.get("/rollout")).json()


async def feed_until(h: Harness, finished, timeout_s: float = 20.0) -> dict:
    """Mirrors two new records at a time until `finished(GET /rollout)`."""
    for _ in range(int(timeout_s / 0.1)):
        body = await rollout(h)
        if finished(body):
            return body
        await h.mirror(2, first=next(_first))
        await asyncio.sleep(0.1)
    raise AssertionError(f"the rollout never finished: {await rollout(h)}")


async def test_identical_candidate_rolls_out_step_by_step_to_the_whole_promote(start_canary):
    h = await start_canary(**FAST)
    started = await h.http.post("/rollout", json=ROLLOUT)
    assert started.status_code == 200, started.text
    assert (started.json()["state"], started.json()["weight"]) == ("running", 0.25)
    body = await feed_until(h, lambda r: r["state"] != "running" and r["applied"])
    assert (body["state"], body["weight"], body["reason"]) == ("completed", 1.0, "every step passed; promoted to 1.0")
    assert [s["state"] for s in body["steps"]] == ["passed"] * 3
    first = body["steps"][0]
    assert first["samples"] >= 2
    assert {c["name"]: c["passed"] for c in first["checks"]} == {
        "error_rate_delta": True, "token_agreement": True, "ttft_p99_delta_s": True, "tpot_p99_delta_s": True,
        "candidate_5xx_delta": True,
    }
    assert h.fakes.scheduler.splits == [("production", "candidate", 0.25), ("production", "candidate", 0.5),
                                        ("candidate", "", 0.0)]
    metrics = (await h.http.get("/metrics")).text.splitlines()
    for line in ("kvmesh_canary_rollout_state 2.0", "kvmesh_canary_rollout_step 3.0", "kvmesh_canary_rollout_weight 1.0",
                 'kvmesh_canary_rollout_step_verdict{step="1",weight="0.25"} 2.0'):
        assert line in metrics, line
    grpc_status = await h.stub.GetRollout(canary_pb2.GetRolloutRequest(), timeout=5)
    assert (grpc_status.state, grpc_status.step, len(grpc_status.steps)) == (canary_pb2.ROLLOUT_STATE_COMPLETED, 3, 3)
    assert grpc_status.steps[0].checks[1].name == "token_agreement"


async def test_different_candidate_is_rolled_back_at_the_first_step_with_the_agreement_figure(start_canary):
    h = await start_canary(candidate_script=lambda prompt: [prompt[0] + 1, 0, 0], **FAST)
    await h.http.post("/rollout", json=ROLLOUT)
    body = await feed_until(h, lambda r: r["state"] != "running" and r["applied"])
    assert (body["state"], body["step"], body["weight"]) == ("rolled_back", 1, 0.0)
    assert body["reason"].startswith("step 1 (0.25) failed: token agreement 0.333 < 0.980")
    assert h.fakes.scheduler.splits == [("production", "candidate", 0.25), ("production", "", 0.0)]
    assert "kvmesh_canary_rollout_state 3.0" in (await h.http.get("/metrics")).text.splitlines()


async def restarted(h: Harness, **overrides) -> CanaryService:
    """A new canary process, as it were, on the same settings and rollout file."""
    await h.canary.close()
    h.canary = CanaryService(h.canary.settings.model_copy(update=overrides))
    await h.canary.start()
    h.http.base_url = f"http://127.0.0.1:{h.canary.http_port}"
    return h.canary


async def test_a_restarted_canary_resumes_the_running_step(start_canary):
    h = await start_canary(**FAST)
    await h.http.post("/rollout", json={"steps": [0.25, 1.0], "min_samples": 2})
    canary = await restarted(h)
    await eventually(lambda: canary.rollout.rollout.applied, what="the step asserted again")
    body = await rollout(h)
    assert (body["state"], body["step"], body["resumed"], body["applied"]) == ("running", 1, 1, True)
    assert h.fakes.scheduler.splits == [("production", "candidate", 0.25)] * 2  # asserted again
    body = await feed_until(h, lambda r: r["state"] != "running" and r["applied"])
    assert body["state"] == "completed"


async def test_a_restarted_canary_can_roll_back_instead(start_canary):
    h = await start_canary(**FAST)
    await h.http.post("/rollout", json=ROLLOUT)
    await restarted(h, rollout_on_restart="rollback")
    status = h.canary.rollout.status()
    assert (status["state"], status["reason"]) == ("rolled_back", "the canary restarted mid-rollout (rollout_on_restart=rollback)")
    await eventually(lambda: h.fakes.scheduler.splits[-1] == ("production", "", 0.0), what="the rollback")


async def test_an_unusable_rollout_file_rolls_back_at_start(start_canary, tmp_path):
    h = await start_canary(**FAST)
    (tmp_path / "rollout.json").write_text("{half a file")
    await restarted(h)
    await eventually(lambda: h.fakes.scheduler.splits == [("production", "", 0.0)], what="the rollback")
    status = h.canary.rollout.status()
    assert status["state"] == "rolled_back" and "is unusable" in status["reason"]
    assert (tmp_path / "rollout.json.unusable").exists()


async def test_admin_key_guards_rollout_and_manual_switches_wait_for_it(start_canary):
    h = await start_canary(admin_key="s3cret", **FAST)
    assert (await h.http.post("/rollout", json=ROLLOUT)).status_code == 401
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await h.stub.StartRollout(canary_pb2.StartRolloutRequest(steps=[0.5, 1.0]), timeout=5)
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
    key = [("authorization", "Bearer s3cret")]
    status = await h.stub.StartRollout(canary_pb2.StartRolloutRequest(steps=[0.5, 1.0]), timeout=5, metadata=key)
    assert (status.state, status.weight, status.min_samples) == (canary_pb2.ROLLOUT_STATE_RUNNING, 0.5, 2)
    assert (await rollout(h))["state"] == "running"  # GET needs no key
    auth = {"Authorization": "Bearer s3cret"}
    assert (await h.http.post("/promote", headers=auth)).status_code == 409
    assert (await h.http.post("/rollout", json=ROLLOUT, headers=auth)).status_code == 409
    assert (await h.http.delete("/rollout")).status_code == 401
    aborted = await h.http.delete("/rollout", headers=auth)
    assert (aborted.json()["state"], aborted.json()["reason"]) == ("aborted", "aborted by the operator")
    assert h.fakes.scheduler.splits == [("production", "candidate", 0.5), ("production", "", 0.0)]
    assert (await h.http.delete("/rollout", headers=auth)).status_code == 409


@pytest.mark.parametrize("body", [b"not json", b"[0.5, 1]", b'{"steps": [0.5]}', b'{"steps": [0.5, 0.2, 1]}',
                                  b'{"steps": [0.5, 1], "min_samples": 0}', b'{"steps": [0.5, 1], "speed": 2}',
                                  b'{"steps": "0.5,1"}', b'{"steps": [0.5, 1], "judge_latency": "yes"}'])
async def test_bad_rollout_requests_are_refused_and_change_nothing(start_canary, body):
    h = await start_canary(**FAST)
    reply = await h.http.post("/rollout", content=body)
    assert reply.status_code == 400 and reply.json()["error"]
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await h.stub.StartRollout(canary_pb2.StartRolloutRequest(steps=[0.5]), timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await rollout(h))["state"] == "idle"
    assert h.fakes.scheduler.splits == []


async def test_a_first_step_the_scheduler_refuses_is_reported_and_rolled_back(start_canary):
    h = await start_canary(**FAST)
    h.fakes.scheduler.refuse_set_pool = True
    reply = await h.http.post("/rollout", json=ROLLOUT)
    assert reply.status_code == 409 and "no workers in pool 'production'" in reply.json()["error"]
    body = await rollout(h)
    assert (body["state"], body["applied"]) == ("rolled_back", False)
    assert body["reason"].startswith("the first step was refused: scheduler")
    h.fakes.scheduler.refuse_set_pool = False  # the rollback is retried until the scheduler takes it
    await eventually(lambda: h.canary.rollout.rollout.applied, what="the rollback")
    assert h.fakes.scheduler.splits == [("production", "", 0.0)]
