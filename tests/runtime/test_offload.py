"""Offload: blocking work on its own threads, bounded; a single thread owns what it runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kvmesh.runtime.offload import Offload


async def test_work_runs_off_the_loop_and_at_most_max_pending_at_once() -> None:
    pool = Offload("kv-codec", threads=4, max_pending=2)
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


async def test_a_single_thread_excludes_locked_callers_and_runs_inline_once_closed() -> None:
    owner = Offload("kvstore-io")
    inside, release, order = threading.Event(), threading.Event(), []

    def slow() -> str:
        inside.set()
        release.wait(5)
        order.append("thread")
        return "slow"

    def dump() -> None:
        order.append("locked")

    running = asyncio.ensure_future(owner.run(slow))
    assert await asyncio.to_thread(inside.wait, 5)
    dumping = asyncio.ensure_future(asyncio.to_thread(owner.locked, dump))  # a synchronous reader elsewhere
    await asyncio.sleep(0.1)
    assert order == []  # it waits for the owner thread's call
    release.set()
    assert await running == "slow"
    await dumping
    assert order == ["thread", "locked"]
    owner.close()
    assert await owner.run(threading.current_thread) is threading.current_thread()
    with pytest.raises(TypeError):
        Offload("pool", threads=2).locked(dump)
