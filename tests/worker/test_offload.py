"""The codec pool: KV bytes work on its own threads, at most `max_pending` jobs at once."""

from __future__ import annotations

import asyncio
import threading

from kvmesh.worker.offload import CodecPool


async def test_work_runs_off_the_loop_and_at_most_max_pending_at_once() -> None:
    pool = CodecPool(threads=4, max_pending=2)
    release = threading.Event()
    started: list[str] = []

    def job(i: int) -> int:
        started.append(threading.current_thread().name)
        release.wait(5)
        return i

    jobs = [asyncio.ensure_future(pool.run(job, i)) for i in range(6)]
    await asyncio.sleep(0.1)
    assert len(started) == 2  # NOTE: the rest wait on the event loop, holding no bytes in flight
    release.set()
    assert await asyncio.gather(*jobs) == list(range(6))
    assert all(name.startswith("kv-codec") for name in started)
    pool.close()
