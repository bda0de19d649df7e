"""The canary service in process, for its tests: real nats-server, fake scheduler and decode workers
on loopback, the service's own gRPC and REST clients."""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
import nats
import pytest

from kvmesh.canary.config import CanarySettings
from kvmesh.canary.service import CanaryService
from kvmesh.runtime.bus import MIRROR_SUBJECT
from kvmesh.runtime.pb import canary_pb2, canary_pb2_grpc

from .fakes import FakeMesh, echo_plus_one
from .records import mirror_record


async def eventually(condition, timeout_s=10.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Harness:
    def __init__(self, fakes: FakeMesh, canary: CanaryService, publisher) -> None:
        self.fakes, self.canary, self.publisher = fakes, canary, publisher
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{canary.port}")
        self.stub = canary_pb2_grpc.CanaryStub(self.channel)
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{canary.http_port}", timeout=5)

    async def publish(self, *records) -> None:
        for record in records:
            data = record if isinstance(record, bytes) else record.SerializeToString()
            await self.publisher.publish(MIRROR_SUBJECT, data)
        await self.publisher.flush()

    async def mirror(self, count: int, first: int = 0) -> None:
        """Publishes `count` distinct records whose production output is echo_plus_one(prompt)."""
        records = []
        for i in range(first, first + count):
            prompt = [i, i + 1, i + 2]
            records.append(mirror_record(f"req-{i}", prompt=prompt, output=echo_plus_one(prompt)))
        await self.publish(*records)

    async def report(self) -> canary_pb2.CanaryReport:
        return await self.stub.GetReport(canary_pb2.GetReportRequest(), timeout=5)

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()
        await self.publisher.close()
        await self.canary.close()
        await self.fakes.stop()


@pytest.fixture
async def start_canary(nats_server, tmp_path):
    started: list[Harness] = []

    async def start(candidate_script=echo_plus_one, **overrides) -> Harness:
        fakes = await FakeMesh(candidate_script).start()
        options = dict(nats_url=nats_server.url, port=0, http_port=0, scheduler=fakes.scheduler_endpoint,
                       min_samples=4, noise_sample=0.0, max_concurrency=2, latency_slack_s=1.0, tracing=False,
                       warmup_replays=0, state_file=str(tmp_path / "rollout.json"))
        options.update(overrides)
        canary = CanaryService(CanarySettings(**options))
        await canary.start()
        publisher = await nats.connect(nats_server.url)
        harness = Harness(fakes, canary, publisher)
        started.append(harness)
        return harness

    yield start
    for harness in started:
        await harness.close()


