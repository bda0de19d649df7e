"""The gateway's periodic worker-list read builds no scheduler stub: one per channel."""

from __future__ import annotations

from kvmesh.gateway.backend import Backend
from kvmesh.gateway.config import GatewaySettings
from kvmesh.runtime.blockhash import BlockHasher


async def test_one_scheduler_stub_per_channel() -> None:
    backend = Backend(GatewaySettings(scheduler="127.0.0.1:1,127.0.0.1:2", nats_url=""), BlockHasher("m", "float32", 16))
    first = backend.scheduler()
    assert backend.scheduler("127.0.0.1:1") is first and backend.scheduler() is first
    assert backend.scheduler("127.0.0.1:2") is not first
    await backend.channels.discard("127.0.0.1:1")  # a new channel gets a new stub
    assert backend.scheduler() is not first
    await backend.channels.close()
