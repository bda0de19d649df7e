"""What every suite uses to look at an implementation: gRPC channels, health, and NATS watchers
(heartbeats, KV events, replay requests), built on the protos and `kvmesh.runtime.bus` only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvmesh.runtime.bus import HEARTBEAT_SUBJECT, KV_EVENTS_SUBJECT, KV_REPLAY_SUBJECT, Bus
from kvmesh.runtime.pb import events_pb2

from .clauses import Skipped, expect

CALL_TIMEOUT_S = 10.0
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


def channel(endpoint: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS)


async def health_status(chan: grpc.aio.Channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=service), timeout=5.0)
    return reply.status


async def expect_serving(chan: grpc.aio.Channel, service_names: tuple[str, ...] = ()) -> None:
    for name in ("", *service_names):
        status = await health_status(chan, name)
        expect(status == health_pb2.HealthCheckResponse.SERVING,
               f"health of {name or 'the server'!r} is {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")


def same_endpoint(advertised: str, given: str) -> bool:
    """Heartbeats name the endpoint others dial; the suite may have been given another host for it."""
    if advertised == given:
        return True
    return advertised.rpartition(":")[2] == given.rpartition(":")[2] and given.rpartition(":")[0] in (
        "127.0.0.1", "localhost", advertised.rpartition(":")[0])


async def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval_s)
    return bool(predicate())


@dataclass(slots=True)
class Beat:
    subject: str
    message: events_pb2.Heartbeat
    received_at: float


@dataclass(slots=True)
class Watcher:
    """Collects heartbeats of one role and the KV events of every publisher, as they arrive."""

    bus: Bus
    role: str
    beats: list[Beat] = field(default_factory=list)
    batches: dict[str, list[events_pb2.KvEventBatch]] = field(default_factory=dict)

    @classmethod
    async def start(cls, nats_url: str, role: str) -> Watcher:
        bus = await Bus.connect(nats_url, f"conform-{role}")
        watcher = cls(bus, role)

        async def on_beat(hb: events_pb2.Heartbeat, msg) -> None:  # noqa: ANN001
            watcher.beats.append(Beat(msg.subject, hb, time.monotonic()))

        async def on_batch(batch: events_pb2.KvEventBatch, msg) -> None:  # noqa: ANN001
            watcher.batches.setdefault(msg.subject.rsplit(".", 1)[-1], []).append(batch)

        await bus.subscribe(HEARTBEAT_SUBJECT.format(role=role, worker_id="*"), events_pb2.Heartbeat, on_beat)
        await bus.subscribe(KV_EVENTS_SUBJECT.format(worker_id="*"), events_pb2.KvEventBatch, on_batch)
        return watcher

    def beats_of(self, endpoint: str) -> list[Beat]:
        return [b for b in self.beats if same_endpoint(b.message.endpoint, endpoint)]

    async def worker_id(self, endpoint: str, timeout_s: float = 5.0) -> str:
        """The id under which the implementation at `endpoint` heartbeats (fails if it does not)."""
        found = await wait_for(lambda: self.beats_of(endpoint), timeout_s)
        expect(found, f"no heartbeat on kvmesh.workers.{self.role}.*.heartbeat names endpoint {endpoint} "
                      f"within {timeout_s:g}s (seen: {sorted({b.message.endpoint for b in self.beats})})")
        return self.beats_of(endpoint)[-1].message.worker_id

    async def replay(self, worker_id: str, from_seq: int) -> events_pb2.KvReplayReply:
        return await self.bus.request(KV_REPLAY_SUBJECT.format(worker_id=worker_id),
                                      events_pb2.KvReplayRequest(from_seq=from_seq), events_pb2.KvReplayReply, 5.0)

    async def close(self) -> None:
        await self.bus.close()


def need(value: object, reason: str) -> None:
    """Skips the running clause with `reason` unless `value` is set."""
    if not value:
        raise Skipped(reason)
