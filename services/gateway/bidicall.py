"""One long-lived bidi gRPC call of the gateway's: the token stream to a decode worker
(decodestream.py) and the Routes stream to a scheduler replica (routestream.py).

Messages go out through a queue (`send`), in order; those queued while the previous one was being
written go as one frame when the subclass can `_pack` them (one gRPC message costs each side
~100 µs of CPU, bench/grpccost.py, whatever its size). The subclass's `_read` task reads what comes
back and, when the call ends, fails whatever is still waiting on it and sets `closed`. The call has
no deadline of its own (it lives like a connection): each request on it has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any


class BidiCall:
    def __init__(self, endpoint: str, open_call: Callable[[AsyncIterator[Any]], Any], name: str) -> None:
        self.endpoint = endpoint
        self.closed = False
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._call = open_call(self._requests())
        self._reader = asyncio.create_task(self._read(), name=f"{name}-{endpoint}")

    def send(self, message: Any) -> None:
        self._outbox.put_nowait(message)

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader

    async def _requests(self) -> AsyncIterator[Any]:
        outbox = self._outbox
        while True:
            queued = [await outbox.get()]
            while queued[-1] is not None and not outbox.empty():
                queued.append(outbox.get_nowait())
            end = queued[-1] is None
            if end:
                queued.pop()
            packed = self._pack(queued) if len(queued) > 1 else None
            if packed is not None:
                yield packed
            else:
                for message in queued:
                    yield message
            if end:
                return

    def _pack(self, messages: list[Any]) -> Any | None:
        """`messages` as one frame, or None to send them one by one (the default)."""
        return None

    async def _read(self) -> None:
        raise NotImplementedError
