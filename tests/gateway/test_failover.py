"""Scheduler replicas from the gateway's side: the endpoint ring, and failover within a request."""

import grpc
import pytest

from kvmesh.gateway.failover import EndpointRing, parse_endpoints
from kvmesh.runtime.grpcutil import start_server
from kvmesh.runtime.launcher import free_port
from kvmesh.runtime.pb import scheduler_pb2_grpc

from ..fakeclock import FakeClock
from .conftest import run_gateway
from .fakes import FakeScheduler, RouteError


def test_endpoints_are_parsed_from_a_comma_separated_setting():
    assert parse_endpoints(" a:1, b:2 ,") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="at least one"):
        parse_endpoints(" , ")


def test_each_request_starts_at_the_next_replica_and_a_failed_one_goes_last_for_a_while():
    clock = FakeClock()
    ring = EndpointRing(["a", "b", "c"], down_s=2.0, clock=clock)
    assert [ring.order()[0] for _ in range(4)] == ["a", "b", "c", "a"]
    ring.failed("b")
    assert ring.order() == ["c", "a", "b"]  # would have started at b
    assert ring.order() == ["c", "a", "b"]
    clock.advance(2.5)
    assert ring.order() == ["a", "b", "c"]
    ring.failed("b")
    ring.succeeded("b")
    assert ring.order() == ["b", "c", "a"]


async def test_a_request_routes_on_the_next_replica_when_one_is_down_and_completes_there(mesh):
    dead = free_port()
    async with run_gateway(mesh, scheduler=f"127.0.0.1:{dead},{mesh.scheduler_endpoint}") as gw, gw.client() as client:
        for _ in range(3):
            reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3})
            assert reply.status_code == 200, reply.text
    assert len(mesh.scheduler.routes) == 3
    assert [c.request_id for c in mesh.scheduler.completes] == [r.request_id for r in mesh.scheduler.routes]


async def test_a_full_replica_hands_the_request_to_a_peer_and_only_all_full_is_a_429(mesh):
    full = FakeScheduler()
    full.error = RouteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "admission queue full", "2")
    server = await start_server("127.0.0.1", 0, [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, full, "kvmesh.v1.Scheduler")])
    try:
        endpoints = f"127.0.0.1:{server.port},{mesh.scheduler_endpoint}"
        async with run_gateway(mesh, scheduler=endpoints) as gw, gw.client() as client:
            for _ in range(2):
                reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
                assert reply.status_code == 200, reply.text
            assert len(mesh.scheduler.completes) == 2 and full.completes == []
            mesh.scheduler.error = RouteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "admission queue full", "3")
            reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
            assert reply.status_code == 429 and reply.headers["retry-after"] in ("2", "3")
    finally:
        await server.stop(0)
