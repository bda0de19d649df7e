"""CacheEvents: the engine's KV events of many steps go out as one ordered batch per interval."""

import asyncio
import threading

from kvmesh.runtime.cacheevents import CacheEvents


class _Engine:
    def __init__(self) -> None:
        self.events: list = []

    def take_kv_events(self) -> list:
        events, self.events = self.events, []
        return events


class _EngineLoop:
    """The two things CacheEvents uses of an EngineLoop: its engine and `post` to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = _Engine()
        self.posts = 0
        self._loop = loop

    def post(self, fn) -> None:
        self.posts += 1
        self._loop.call_soon_threadsafe(fn)


class _Publisher:
    def __init__(self) -> None:
        self.batches: list[list] = []

    async def publish(self, events) -> None:
        self.batches.append(list(events))


async def test_the_events_of_many_steps_go_out_as_one_batch_in_order():
    loop = _EngineLoop(asyncio.get_running_loop())
    events = CacheEvents(loop, flush_interval_s=0.05)
    events.publisher = publisher = _Publisher()
    hashes = [bytes([i]) * 32 for i in range(6)]

    def engine_thread() -> None:  # five steps: four blocks stored (a chain), then the first one evicted
        for i in range(4):
            loop.engine.events = [("stored", [hashes[i]], hashes[i - 1] if i else None)]
            events._on_step(loop.engine, [])
        loop.engine.events = [("removed", [hashes[0]], None)]
        events._on_step(loop.engine, [])

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if publisher.batches:
            break
    await asyncio.sleep(0.06)
    assert loop.posts == 1  # one hand-over from the engine thread, not one per step
    assert len(publisher.batches) == 1
    batch = publisher.batches[0]
    assert [e.WhichOneof("event") for e in batch] == ["stored"] * 4 + ["removed"]
    assert [e.stored.block_hashes[0] for e in batch[:4]] == hashes[:4]
    assert [e.stored.parent_hash for e in batch[:4]] == [b"", *hashes[:3]]
    assert list(events.held) == hashes[1:4]

    loop.engine.events = [("stored", [hashes[4]], hashes[3])]  # a later step: a new batch
    events._on_step(loop.engine, [])
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(publisher.batches) == 2:
            break
    assert [e.stored.block_hashes[0] for e in publisher.batches[1]] == [hashes[4]]
