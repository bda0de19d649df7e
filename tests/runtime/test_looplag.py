"""LoopLag: a loop held by a blocking callback shows as lag; an idle loop shows only the timer's own."""

import asyncio
import time

from kvmesh.runtime.looplag import LoopLag


def test_a_blocked_loop_is_seen_late_and_the_task_stops_on_close():
    seen: list[float] = []

    async def main() -> None:
        lag = LoopLag(seen.append, interval_s=0.01)
        lag.start()
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # noqa: ASYNC251 - the point: hold the loop
        await asyncio.sleep(0.03)
        await lag.close()
        count = len(seen)
        await asyncio.sleep(0.05)
        assert len(seen) == count  # closed: no more observations

    asyncio.run(main())
    assert max(seen) >= 0.15
    assert min(seen) >= 0.0
    assert len(seen) >= 3
