"""The canary service in process: real nats-server, fake scheduler and decode workers on loopback."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.runtime.pb import canary_pb2

from .fakes import echo_plus_one
from .harness import eventually, start_canary  # noqa: F401 - the fixture
from .records import mirror_record

pytestmark = pytest.mark.timeout(60)


async def test_identical_candidate_agrees_fully_and_passes(start_canary):
    h = await start_canary()
    await h.mirror(4)
    await eventually(lambda: h.canary.report().summary.samples == 4, what="4 samples")
    report = await h.report()
    assert report.verdict == canary_pb2.VERDICT_PASS
    assert (report.samples, report.token_agreement, report.exact_match_rate) == (4, 1.0, 1.0)
    assert report.mean_first_divergence == -1.0
    assert (report.mirror_received, report.mirror_dropped, report.mirror_malformed) == (4, 0, 0)
    assert (report.production_pool, report.candidate_pool) == ("production", "candidate")


async def test_replay_uses_candidate_pool_same_prompt_sampling_and_seed(start_canary):
    h = await start_canary()
    record = mirror_record("req-x", prompt=(5, 6, 7), output=(6, 7, 8), seed=1234, max_tokens=3)
    await h.publish(record)
    await eventually(lambda: len(h.fakes.scheduler.completes) == 1, what="one Complete")
    [route] = h.fakes.scheduler.routes
    assert (route.pool, route.request_id, route.num_prompt_tokens, route.max_tokens) == ("candidate", "canary-req-x", 3, 3)
    [generate] = h.fakes.candidate.requests
    assert list(generate.prompt_token_ids) == [5, 6, 7]
    assert generate.sampling == record.sampling
    assert generate.sampling.seed == 1234
    assert h.fakes.production.requests == []
    assert [(c.request_id, c.status) for c in h.fakes.scheduler.completes] == [("canary-req-x", "ok")]


async def test_different_candidate_has_low_agreement_and_fails(start_canary):
    h = await start_canary(candidate_script=lambda prompt: [prompt[0] + 1, 0, 0])
    await h.mirror(4)
    await eventually(lambda: h.canary.report().summary.samples == 4, what="4 samples")
    report = await h.report()
    assert report.verdict == canary_pb2.VERDICT_FAIL
    assert report.token_agreement == pytest.approx(1 / 3)
    assert (report.exact_match_rate, report.mean_first_divergence) == (0.0, 1.0)
    assert report.reason.startswith("token agreement 0.333 < 0.980")


async def test_noise_replays_go_to_production_and_set_the_noise_floor(start_canary):
    h = await start_canary(noise_sample=1.0)
    await h.mirror(4)
    await eventually(lambda: h.canary.report().summary.noise_samples == 4, what="4 noise samples")
    pools = sorted((r.pool, r.request_id) for r in h.fakes.scheduler.routes)
    assert pools[:4] == [("candidate", f"canary-req-{i}") for i in range(4)]
    assert pools[4:] == [("production", f"canary-noise-req-{i}") for i in range(4)]
    assert (await h.report()).noise_floor_agreement == 1.0


async def test_malformed_messages_are_counted_and_the_service_keeps_going(start_canary):
    h = await start_canary(min_samples=1)
    await h.publish(b"\xff\xff\xff not a protobuf", mirror_record("empty", prompt=()))
    no_sampling = mirror_record("nosampling")
    no_sampling.ClearField("sampling")
    await h.publish(no_sampling)
    await eventually(lambda: h.canary.report().malformed == 3, what="3 malformed")
    await h.mirror(1)
    await eventually(lambda: h.canary.report().summary.samples == 1, what="a sample after the bad ones")
    report = await h.report()
    assert (report.mirror_malformed, report.mirror_received, report.verdict) == (3, 3, canary_pb2.VERDICT_PASS)


async def test_duplicates_are_replayed_once(start_canary):
    h = await start_canary(min_samples=1)
    record = mirror_record("dup", prompt=(1, 2), output=(2, 3))
    same_prompt = mirror_record("dup-2", prompt=(1, 2), output=(2, 3))
    await h.publish(record, record, same_prompt)
    await eventually(lambda: h.canary.report().duplicates == 2, what="2 duplicates")
    await eventually(lambda: h.canary.report().summary.samples == 1, what="1 sample")
    assert len(h.fakes.candidate.requests) == 1


async def test_slow_candidate_fills_the_buffer_and_drops_are_counted(start_canary):
    h = await start_canary(max_concurrency=1, buffer_max_records=2)
    h.fakes.candidate.gate = asyncio.Event()
    await h.mirror(1)
    await eventually(lambda: len(h.fakes.candidate.requests) == 1, what="the first replay to start")
    await h.mirror(4, first=1)
    await eventually(lambda: h.canary.report().received == 5, what="5 records received")
    report = await h.report()
    assert (report.mirror_dropped, report.buffered) == (2, 2)
    assert h.canary.health()["replaying"] == 1
    h.fakes.candidate.gate.set()
    await eventually(lambda: h.canary.report().summary.samples == 3, what="3 samples")
    await eventually(lambda: h.canary.health()["replaying"] == 0, what="the replays to end")
    assert len(h.fakes.production.requests) == 0


async def test_promote_and_rollback_move_the_production_pool(start_canary):
    h = await start_canary()
    promoted = await h.stub.Promote(canary_pb2.PromoteRequest(), timeout=5)
    assert promoted.production_pool == "candidate"
    assert h.fakes.scheduler.set_pool_calls == ["candidate"]
    report = await h.report()
    assert (report.production_pool, report.candidate_pool) == ("candidate", "production")
    rolled_back = await h.stub.Rollback(canary_pb2.RollbackRequest(), timeout=5)
    assert rolled_back.production_pool == "production"
    assert h.fakes.scheduler.set_pool_calls == ["candidate", "production"]
    assert h.fakes.scheduler.production_pool == "production"


async def test_after_promote_replays_target_the_former_production_pool(start_canary):
    h = await start_canary(min_samples=1)
    await h.stub.Promote(canary_pb2.PromoteRequest(), timeout=5)
    await h.mirror(1)
    await eventually(lambda: h.canary.report().summary.samples == 1, what="1 sample")
    assert [r.pool for r in h.fakes.scheduler.routes] == ["production"]


async def test_promote_refused_by_the_scheduler_keeps_the_pools(start_canary):
    h = await start_canary()
    h.fakes.scheduler.refuse_set_pool = True
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await h.stub.Promote(canary_pb2.PromoteRequest(), timeout=5)
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no workers in pool 'candidate'" in failure.value.details()
    assert (await h.report()).production_pool == "production"
    reply = await h.http.post("/promote")
    assert reply.status_code == 409


async def test_candidate_errors_are_counted(start_canary):
    h = await start_canary(min_samples=2, candidate_pool="missing")
    await h.mirror(2)
    await eventually(lambda: h.canary.report().summary.samples == 2, what="2 samples")
    report = await h.report()
    assert (report.candidate_error_rate, report.production_error_rate) == (1.0, 0.0)
    assert report.verdict == canary_pb2.VERDICT_FAIL
    assert report.reason.startswith("error rate 1.000 vs production 0.000")


async def test_rest_report_promote_rollback_health_and_metrics(start_canary):
    h = await start_canary()
    await h.mirror(4)
    await eventually(lambda: h.canary.report().summary.samples == 4, what="4 samples")
    body = (await h.http.get("/report")).json()
    assert (body["verdict"], body["samples"], body["token_agreement"]) == ("pass", 4, 1.0)
    assert body["mirror_received"] == 4
    assert set(body["ttft"]) == {"production_p50_s", "production_p99_s", "candidate_p50_s", "candidate_p99_s",
                                 "delta_p50_s", "delta_p99_s"}
    health = await h.http.get("/health")
    assert (health.status_code, health.json()["nats_connected"]) == (200, True)
    metrics = (await h.http.get("/metrics")).text
    for line in (
        "kvmesh_canary_verdict 1.0",
        "kvmesh_canary_samples 4.0",
        "kvmesh_canary_token_agreement 1.0",
        "kvmesh_canary_exact_match_rate 1.0",
        "kvmesh_canary_noise_floor_agreement 1.0",
        "kvmesh_canary_mirror_received_total 4.0",
        "kvmesh_canary_mirror_dropped_total 0.0",
        "kvmesh_canary_mirror_malformed_total 0.0",
    ):
        assert line in metrics.splitlines(), line
    assert 'kvmesh_canary_ttft_delta_seconds{quantile="0.99"}' in metrics
    assert 'kvmesh_canary_tpot_delta_seconds{quantile="0.5"}' in metrics
    promoted = await h.http.post("/promote")
    assert promoted.json() == {"production_pool": "candidate", "candidate_pool": "production", "promoted_weight": 0.0}
    assert (await h.http.get("/report")).json()["verdict"] == "collecting"
    rolled_back = await h.http.post("/rollback")
    assert rolled_back.json() == {"production_pool": "production", "candidate_pool": "candidate", "promoted_weight": 0.0}


async def test_stepwise_promote_splits_production_and_keeps_comparing(start_canary):
    h = await start_canary(min_samples=2)
    reply = await h.stub.Promote(canary_pb2.PromoteRequest(weight=0.25), timeout=5)
    assert reply.production_pool == "production"
    assert h.fakes.scheduler.splits == [("production", "candidate", 0.25)]
    # A request the candidate served itself is not compared; the others are.
    served_by_candidate = mirror_record("req-c", prompt=[7, 8, 9], output=echo_plus_one([7, 8, 9]))
    served_by_candidate.pool = "candidate"
    await h.publish(served_by_candidate)
    await h.mirror(2)
    await eventually(lambda: h.canary.report().summary.samples == 2, what="2 samples")
    report = await h.report()
    assert (report.promoted_weight, report.mirror_candidate_served, report.mirror_received) == (0.25, 1, 3)
    assert report.verdict == canary_pb2.VERDICT_PASS
    metrics = (await h.http.get("/metrics")).text.splitlines()
    assert "kvmesh_canary_promoted_weight 0.25" in metrics
    assert "kvmesh_canary_mirror_candidate_served_total 1.0" in metrics

    stepped = await h.http.post("/promote", json={"weight": 0.5})
    assert stepped.json() == {"production_pool": "production", "candidate_pool": "candidate", "promoted_weight": 0.5}
    assert (await h.report()).verdict == canary_pb2.VERDICT_PASS  # same candidate: the evidence stays
    await h.http.post("/promote", json={"weight": 1})
    assert h.fakes.scheduler.splits[-1] == ("candidate", "", 0.0)
    report = await h.report()
    assert (report.production_pool, report.promoted_weight, report.samples) == ("candidate", 0.0, 0)


async def test_rollback_of_a_stepwise_promote_takes_all_traffic_back(start_canary):
    h = await start_canary()
    await h.stub.Promote(canary_pb2.PromoteRequest(weight=0.5), timeout=5)
    rolled_back = await h.http.post("/rollback")
    assert rolled_back.json()["promoted_weight"] == 0.0
    assert h.fakes.scheduler.splits[-1] == ("production", "", 0.0)


@pytest.mark.parametrize("body", [b'{"weight": 1.5}', b'{"weight": -0.1}', b'{"weight": "half"}', b'{"weight": true}',
                                  b'{"share": 0.5}', b"[0.5]", b"not json"])
async def test_bad_promote_weights_are_refused_and_change_nothing(start_canary, body):
    h = await start_canary()
    reply = await h.http.post("/promote", content=body)
    assert reply.status_code == 400 and reply.json()["error"]
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await h.stub.Promote(canary_pb2.PromoteRequest(weight=1.5), timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert h.fakes.scheduler.splits == []
    assert (await h.report()).promoted_weight == 0.0


async def test_an_admin_key_guards_rest_promote_and_rollback(start_canary):
    h = await start_canary(admin_key="s3cret")
    for path in ("/promote", "/rollback"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            reply = await h.http.post(path, headers=headers)
            assert reply.status_code == 401 and "admin key" in reply.json()["error"]
    assert h.fakes.scheduler.splits == []
    reply = await h.http.post("/promote", json={"weight": 0.2}, headers={"Authorization": "Bearer s3cret"})
    assert reply.status_code == 200 and reply.json()["promoted_weight"] == 0.2
    assert (await h.http.get("/report")).status_code == 200  # reading stays open
