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


async def test_a_three_node_cluster_routes_messages_and_clients_get_every_node(tmp_path):
    import subprocess  # noqa: PLC0415

    from kvmesh.runtime.launcher import free_port  # noqa: PLC0415
    from kvmesh.runtime.supervisor import _wait_tcp, nats_server_binary  # noqa: PLC0415

    auth = NatsAuth.generate()
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    procs = []
    for i in range(3):
        conf = tmp_path / f"nats-{i}.conf"
        conf.write_text(auth.server_config("127.0.0.1", ports[i], routes[i], routes, f"nats-{i}"))
        procs.append(subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    try:
        for port in ports:
            _wait_tcp("127.0.0.1", port, 10)
        url = auth.url("decode", "127.0.0.1", ports)
        assert url.count("nats://decode:") == 3
        decode = await Bus.connect(url, "decode", dont_randomize=True)  # on node 0, then 1, then 2
        scheduler = await Bus.connect(auth.url("scheduler", "127.0.0.1", ports[::-1]), "scheduler", dont_randomize=True)
        assert (decode.client.connected_url.port, scheduler.client.connected_url.port) == (ports[0], ports[2])
        got = asyncio.Queue()

        async def on_beat(message, _msg):
            await got.put(message.worker_id)

        await scheduler.subscribe("kvmesh.workers.>", events_pb2.Heartbeat, on_beat)
        await scheduler.client.flush()
        for _ in range(50):  # the cluster's routes form within moments of start
            await decode.publish("kvmesh.workers.decode.d1.heartbeat", events_pb2.Heartbeat(worker_id="d1"))
            try:
                assert await asyncio.wait_for(got.get(), 0.2) == "d1"
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError("a message published on node 0 never reached a subscriber on node 2")
        victim = procs[ports.index(decode.client.connected_url.port)]
        victim.kill()  # kill -9 the node the publisher is on: it reconnects to another of its URLs
        victim.wait(10)
        while not got.empty():
            got.get_nowait()
        for _ in range(50):
            if decode.connected:
                await decode.publish("kvmesh.workers.decode.d1.heartbeat", events_pb2.Heartbeat(worker_id="d2"))
                try:
                    if await asyncio.wait_for(got.get(), 0.2) == "d2":
                        break
                except TimeoutError:
                    pass
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the publisher never came back through another node")
        await decode.close()
        await scheduler.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
