import asyncio

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.pb import events_pb2


async def _until(predicate, timeout_s=10.0):
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_protobuf_round_trip_and_malformed_payloads_are_dropped(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    got = []

    async def on_heartbeat(message, _raw):
        got.append(message.worker_id)

    await bus.subscribe("kvmesh.workers.*.*.heartbeat", events_pb2.Heartbeat, on_heartbeat)
    await bus.publish("kvmesh.workers.decode.d1.heartbeat", events_pb2.Heartbeat(worker_id="d1"))
    await bus.client.publish("kvmesh.workers.decode.d2.heartbeat", b"\xff\xff\xff not protobuf")
    await bus.publish("kvmesh.workers.decode.d3.heartbeat", events_pb2.Heartbeat(worker_id="d3"))
    assert await _until(lambda: len(got) == 2 and bus.malformed == 1)
    assert got == ["d1", "d3"]
    await bus.close()


async def test_reconnects_after_a_nats_restart_and_runs_hooks(nats_server):
    bus = await Bus.connect(nats_server.url, "test")
    announced = []

    async def announce():
        announced.append(True)

    bus.on_reconnect(announce)
    await asyncio.get_running_loop().run_in_executor(None, nats_server.restart)
    assert await _until(lambda: announced and bus.connected, timeout_s=15)
    await bus.close()


async def test_a_publisher_beats_when_a_scheduler_asks_at_most_once_per_gap(nats_server):
    from kvmesh.runtime.heartbeats import beat_on_request, request_heartbeats  # noqa: PLC0415

    worker, scheduler = await Bus.connect(nats_server.url, "worker"), await Bus.connect(nats_server.url, "scheduler")
    beats = []

    async def beat():
        beats.append(True)

    await beat_on_request(worker, beat, min_gap_s=5.0)
    await worker.client.flush()

    async def asked_and_beaten() -> bool:
        # NOTE: fire-and-forget, as in the mesh (the periodic heartbeats cover a lost one): in two
        # full-suite runs the first request of this test never arrived (not reproduced alone), so
        # it asks again until a beat comes; every ask here falls within the gap.
        await request_heartbeats(scheduler, "scheduler-0")
        await scheduler.client.flush()
        return await _until(lambda: len(beats) >= 1, timeout_s=0.5)

    for _ in range(10):
        if await asked_and_beaten():
            break
    assert len(beats) == 1
    await request_heartbeats(scheduler, "scheduler-1")  # within the gap: no second beat
    await scheduler.client.flush()
    await worker.client.flush()
    await asyncio.sleep(0.1)
    assert len(beats) == 1
    await worker.close()
    await scheduler.close()


async def test_close_is_bounded_when_the_server_stops_answering(nats_server):
    """A drain waits for the server (nats-py: up to 30 s for the subscriptions, 10 s more for a
    flush); a service shutting down beside a dying nats-server must not wait that long."""
    import os
    import signal
    import time

    from kvmesh.runtime.bus import CLOSE_S

    bus = await Bus.connect(nats_server.url, "test")

    async def ignore(_message, _raw):
        pass

    await bus.subscribe("kvmesh.workers.*.*.heartbeat", events_pb2.Heartbeat, ignore)
    os.kill(nats_server.proc.pid, signal.SIGSTOP)  # connected, but nothing answers
    try:
        started = time.monotonic()
        await bus.close()
        took = time.monotonic() - started
    finally:
        os.kill(nats_server.proc.pid, signal.SIGCONT)
    assert took < CLOSE_S + 1.5 and bus.client.is_closed
