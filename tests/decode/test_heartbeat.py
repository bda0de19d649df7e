"""Workers announce themselves on NATS every heartbeat interval and say so when they drain."""

from __future__ import annotations

import asyncio

from kvmesh.decode.main import start
from kvmesh.runtime.bus import Bus
from kvmesh.runtime.pb import common_pb2, events_pb2

from .helpers import decode_settings


async def test_heartbeats_carry_the_endpoint_and_capacity_then_draining(nats_server) -> None:
    bus = await Bus.connect(nats_server.url, "decode-test")
    listener = await Bus.connect(nats_server.url, "listener")
    beats: list[events_pb2.Heartbeat] = []

    async def on_beat(msg: events_pb2.Heartbeat, _raw) -> None:
        beats.append(msg)

    await listener.subscribe("kvmesh.workers.decode.*.heartbeat", events_pb2.Heartbeat, on_beat)
    app = await start(decode_settings(worker_id="d-1", heartbeat_interval_s=0.05), bus)
    try:
        for _ in range(200):
            if len(beats) >= 2:
                break
            await asyncio.sleep(0.02)
        beat = beats[0]
        assert (beat.worker_id, beat.role, beat.endpoint) == ("d-1", common_pb2.WORKER_ROLE_DECODE, app.endpoint)
        assert (beat.block_size, beat.kv_blocks_total, beat.kv_blocks_free) == (4, 64, 64)
        assert beat.pool == "production" and beat.model == "tiny" and not beat.draining
        assert beat.reports_progress and beat.HasField("live_requests")  # issue 16 items 3 and 5
        await app.deregister()
        for _ in range(200):
            if beats[-1].draining:
                break
            await asyncio.sleep(0.02)
        assert beats[-1].draining
    finally:
        await app.close()
        await bus.close()
        await listener.close()
