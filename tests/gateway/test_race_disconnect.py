"""DisconnectWatch: the work runs in the caller's task, a client that leaves cancels it, and one
watch task serves every race of a request."""

from __future__ import annotations

import asyncio

import pytest

from kvmesh.gateway.streaming import ClientDisconnected, DisconnectWatch


def receiver(leave: asyncio.Event):
    async def receive() -> dict:
        await leave.wait()
        return {"type": "http.disconnect"}

    return receive


async def race_disconnect(receive, work):
    watch = DisconnectWatch(receive)
    try:
        return await watch.race(work)
    finally:
        watch.close()


async def test_the_work_runs_in_the_callers_task_without_a_loop_iteration_first() -> None:
    ran_in = []

    async def work() -> int:
        ran_in.append(asyncio.current_task())
        return 7

    caller = asyncio.current_task()
    assert await race_disconnect(receiver(asyncio.Event()), work()) == 7
    assert ran_in == [caller]


async def test_a_client_that_leaves_cancels_the_work_and_raises_client_disconnected() -> None:
    leave, cancelled = asyncio.Event(), []

    async def work() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    asyncio.get_running_loop().call_later(0.05, leave.set)
    with pytest.raises(ClientDisconnected):
        await race_disconnect(receiver(leave), work())
    assert cancelled == [True]
    assert asyncio.current_task().cancelling() == 0  # the caller is not left half-cancelled
    await asyncio.sleep(0)  # and it can await again


async def test_a_cancel_from_outside_is_a_cancel_not_a_disconnect() -> None:
    async def handler() -> None:
        await race_disconnect(receiver(asyncio.Event()), asyncio.sleep(30))

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_works_own_error_is_raised_and_the_watch_ends() -> None:
    async def work() -> None:
        raise ValueError("bad")

    before = len(asyncio.all_tasks())
    with pytest.raises(ValueError):
        await race_disconnect(receiver(asyncio.Event()), work())
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


async def test_one_watch_task_serves_every_race_of_a_request_and_close_ends_it() -> None:
    async def work(v: int) -> int:
        await asyncio.sleep(0)
        return v

    before = len(asyncio.all_tasks())
    watch = DisconnectWatch(receiver(asyncio.Event()))
    assert await watch.race(work(1)) == 1
    assert len(asyncio.all_tasks()) == before + 1
    assert await watch.race(work(2)) == 2
    assert len(asyncio.all_tasks()) == before + 1  # the same watch, not a second one
    watch.close()
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


async def test_a_client_that_left_between_races_fails_the_next_race_without_running_it() -> None:
    leave, ran = asyncio.Event(), []

    async def work() -> None:
        ran.append(True)

    watch = DisconnectWatch(receiver(leave))
    await watch.race(work())
    leave.set()
    await asyncio.sleep(0.01)  # the watch hears the client leave while no race runs: nothing to cancel
    assert watch.left and asyncio.current_task().cancelling() == 0
    with pytest.raises(ClientDisconnected):
        await watch.race(work())
    assert ran == [True]
    watch.close()
