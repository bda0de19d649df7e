"""The mirror tap samples, queues and publishes without ever blocking; drops are counted."""

from __future__ import annotations

import asyncio
import subprocess
import socket
import sys
from pathlib import Path

import pytest

from kvmesh.gateway.metrics import GatewayMetrics
from kvmesh.gateway.mirror import MirrorTap, mirror_record
from kvmesh.runtime.bus import MIRROR_SUBJECT, Bus
from kvmesh.runtime.pb import common_pb2, events_pb2

from .conftest import eventually, run_gateway
from .fakes import FakeMesh


def record(request_id: str = "r1") -> events_pb2.MirrorRecord:
    return mirror_record(request_id, "tiny", "s", [1, 2], common_pb2.SamplingParams(seed=3), [4], "length", 0.1, 0.01)


class FakeBus:
    def __init__(self) -> None:
        self.published: list[tuple[str, events_pb2.MirrorRecord]] = []
        self.connected = True

    async def publish(self, subject: str, message: events_pb2.MirrorRecord) -> None:
        self.published.append((subject, message))

    async def close(self) -> None:
        self.connected = False


async def test_unsampled_requests_are_not_built() -> None:
    tap = MirrorTap(0.5, 8, GatewayMetrics(), bus=FakeBus(), draw=lambda: 0.5)
    assert tap.offer(lambda: pytest.fail("built an unsampled record")) is False
    assert MirrorTap(0.0, 8, GatewayMetrics(), draw=lambda: 0.0).offer(record) is False


async def test_full_queue_drops_and_counts() -> None:
    metrics = GatewayMetrics()
    tap = MirrorTap(1.0, 1, metrics, bus=FakeBus(), draw=lambda: 0.0)
    assert tap.offer(record) is True
    assert tap.offer(record) is False  # the drainer has not run yet: the one slot is taken
    assert metrics.mirror_dropped._value.get() == 1
    await tap.close()


async def test_queued_records_are_published_on_the_mirror_subject() -> None:
    metrics, bus = GatewayMetrics(), FakeBus()
    tap = MirrorTap(1.0, 8, metrics, bus=bus, draw=lambda: 0.0)
    tap.offer(lambda: record("a"))
    tap.offer(lambda: record("b"))
    await eventually(lambda: len(bus.published) == 2)
    assert [(s, m.request_id) for s, m in bus.published] == [(MIRROR_SUBJECT, "a"), (MIRROR_SUBJECT, "b")]
    assert metrics.mirror_published._value.get() == 2
    await tap.close()


async def test_without_nats_records_are_dropped_not_waited_for() -> None:
    metrics = GatewayMetrics()
    tap = MirrorTap(1.0, 8, metrics, nats_url="", draw=lambda: 0.0)
    tap.offer(record)
    await eventually(lambda: metrics.mirror_dropped._value.get() == 1)
    await tap.close()


async def test_app_mirrors_finished_requests(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, mirror_sample=1.0) as gw:
        gw.app.state.mirror.bus = bus = FakeBus()
        async with gw.client() as client:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "seed": 11, "temperature": 0}
            resp = await client.post("/v1/completions", json=body, headers={"X-Request-Id": "m-1"})
        await eventually(lambda: len(bus.published) == 1)
    rec = bus.published[0][1]
    assert (rec.request_id, rec.model, rec.finish_reason, rec.error, rec.pool) == (resp.json()["id"], "tiny", "length", "", "production")
    assert list(rec.prompt_token_ids) == [256, 104, 105]
    assert [chr(t) for t in rec.output_token_ids] == list(resp.json()["choices"][0]["text"])
    assert (rec.sampling.seed, rec.sampling.max_tokens, rec.sampling.temperature) == (11, 3, 0.0)
    assert rec.ttft_s > 0


async def test_app_counts_mirror_drops_when_nats_is_missing(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, mirror_sample=1.0, nats_url="nats://127.0.0.1:9") as gw, gw.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert resp.status_code == 200
        await eventually(lambda: gw.metrics.mirror_dropped._value.get() == 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_records_reach_a_real_nats_subscriber(tmp_path: Path) -> None:
    port = _free_port()
    nats_server = Path(sys.executable).parent / "nats-server"
    proc = subprocess.Popen([str(nats_server), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"nats://127.0.0.1:{port}"
        sub = None
        for _ in range(100):
            try:
                sub = await Bus.connect(url, "test-canary", connect_timeout_s=0.5)
                break
            except Exception:  # noqa: BLE001 - server still starting
                await asyncio.sleep(0.05)
        assert sub is not None
        got: list[events_pb2.MirrorRecord] = []

        async def on_record(msg: events_pb2.MirrorRecord, _raw) -> None:
            got.append(msg)

        await sub.subscribe(MIRROR_SUBJECT, events_pb2.MirrorRecord, on_record)
        metrics = GatewayMetrics()
        tap = MirrorTap(1.0, 8, metrics, nats_url=url, draw=lambda: 0.0)
        tap.offer(lambda: record("early"))  # may be dropped while connecting; never blocks
        await eventually(lambda: tap.bus is not None and tap.bus.connected)
        tap.offer(lambda: record("nats-1"))
        await eventually(lambda: any(r.request_id == "nats-1" for r in got))
        await tap.close()
        await sub.close()
    finally:
        proc.terminate()
        proc.wait(timeout=5)


async def test_admin_routes_are_off_without_an_admin_key(mesh: FakeMesh) -> None:
    async with run_gateway(mesh) as gw, gw.client() as client:
        resp = await client.put("/admin/mirror", json={"sample": 1.0})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"
    assert gw.app.state.mirror.sample == 0.0


async def test_admin_key_turns_mirroring_on_and_off_at_run_time(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, admin_key="adm") as gw, gw.client() as client:
        gw.app.state.mirror.bus = bus = FakeBus()
        admin = {"Authorization": "Bearer adm"}
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        await client.post("/v1/completions", json=body)
        assert (await client.put("/admin/mirror", json={"sample": 1.0}, headers=admin)).json() == {"sample": 1.0}
        mirrored = (await client.post("/v1/completions", json=body, headers={"X-Request-Id": "on"})).json()["id"]
        await eventually(lambda: len(bus.published) == 1)
        assert (await client.put("/admin/mirror", json={"sample": 0}, headers=admin)).json() == {"sample": 0.0}
        await client.post("/v1/completions", json=body)
        assert (await client.get("/admin/mirror", headers=admin)).json() == {"sample": 0.0}
    assert [m.request_id for _, m in bus.published] == [mirrored]


@pytest.mark.parametrize(
    ("headers", "payload", "status"),
    [
        ({}, {"sample": 0.5}, 401),
        ({"Authorization": "Bearer wrong"}, {"sample": 0.5}, 401),
        ({"Authorization": "Bearer wrong"}, {"sample": 7}, 401),
        ({"Authorization": "Bearer adm"}, {"sample": 1.5}, 400),
        ({"Authorization": "Bearer adm"}, {"sample": "all"}, 400),
        ({"Authorization": "Bearer adm"}, {"fraction": 0.5}, 400),
    ],
)
async def test_admin_mirror_rejects_bad_keys_and_bad_samples(mesh: FakeMesh, headers, payload, status) -> None:
    async with run_gateway(mesh, admin_key="adm") as gw, gw.client() as client:
        resp = await client.put("/admin/mirror", json=payload, headers=headers)
    assert resp.status_code == status
    assert resp.json()["error"]["message"]
    assert gw.app.state.mirror.sample == 0.0


async def test_each_record_is_published_under_the_trace_of_the_request_it_mirrors() -> None:
    from opentelemetry import trace  # noqa: PLC0415

    class TracingBus(FakeBus):
        def __init__(self) -> None:
            super().__init__()
            self.trace_ids: list[int] = []

        async def publish(self, subject, message) -> None:
            await super().publish(subject, message)
            self.trace_ids.append(trace.get_current_span().get_span_context().trace_id)

    def span(trace_id: int) -> trace.Span:
        ctx = trace.SpanContext(trace_id, 1, is_remote=False, trace_flags=trace.TraceFlags(1))
        return trace.NonRecordingSpan(ctx)

    bus = TracingBus()
    tap = MirrorTap(1.0, 8, GatewayMetrics(), bus=bus, draw=lambda: 0.0)
    for trace_id, rid in ((0xA, "a"), (0xB, "b")):
        with trace.use_span(span(trace_id)):
            tap.offer(lambda rid=rid: record(rid))  # the first offer starts the drain task under trace A
    await eventually(lambda: len(bus.published) == 2)
    assert bus.trace_ids == [0xA, 0xB]
    await tap.close()
