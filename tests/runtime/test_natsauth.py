import asyncio

import nats
import pytest
from nats.errors import NoServersError

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.natsauth import NatsAuth
from kvmesh.runtime.pb import events_pb2


@pytest.fixture
def secured_nats(nats_server, tmp_path):
    """The shared nats_server fixture restarted with the generated per-service users."""
    auth = NatsAuth.generate()
    conf = tmp_path / "nats.conf"
    conf.write_text(auth.server_config("127.0.0.1", nats_server.port))
    nats_server.stop()
    import subprocess  # noqa: PLC0415

    from kvmesh.runtime.supervisor import _wait_tcp, nats_server_binary  # noqa: PLC0415

    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_tcp("127.0.0.1", nats_server.port, 10)
    yield auth, nats_server.port
    proc.terminate()
    proc.wait(10)


async def test_a_client_without_credentials_is_refused(secured_nats):
    _, port = secured_nats
    with pytest.raises((NoServersError, nats.errors.Error, OSError)):
        await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=2, max_reconnect_attempts=0,
                           allow_reconnect=False)


async def test_each_service_may_publish_only_its_own_subjects(secured_nats):
    auth, port = secured_nats
    scheduler = await Bus.connect(auth.url("scheduler", "127.0.0.1", port), "scheduler")
    seen = []

    async def on_heartbeat(message, _raw):
        seen.append(message.worker_id)

    await scheduler.subscribe("kvmesh.workers.>", events_pb2.Heartbeat, on_heartbeat)
    await scheduler.client.flush()
    gateway = await Bus.connect(auth.url("gateway", "127.0.0.1", port), "gateway")
    decode = await Bus.connect(auth.url("decode", "127.0.0.1", port), "decode")
    await gateway.publish("kvmesh.workers.decode.fake.heartbeat", events_pb2.Heartbeat(worker_id="forged"))
    await decode.publish("kvmesh.workers.decode.d0.heartbeat", events_pb2.Heartbeat(worker_id="d0"))
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert seen == ["d0"]
    for bus in (scheduler, gateway, decode):
        await bus.close()
