"""One long-lived bidi gRPC call of the gateway's: the token stream to a decode worker
(decodestream.py) and the Routes stream to a scheduler replica (routestream.py).

Messages go out through a queue (`send`), in order; those queued while the previous one was being
written go as one frame (`_batch`) once the peer has said it reads packed frames (one gRPC
message costs each side ~100 µs of CPU, bench/grpccost.py, whatever its size). The subclass's
`_read` task reads what comes back (`_frames`) and, when the call ends, fails whatever is still
waiting on it and sets `closed`. The call has no deadline of its own (it lives like a connection):
each request on it has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from kvmesh.runtime.grpcutil import peer_batches, take_ready


class BidiCall:
    def __init__(self, endpoint: str, open_call: Callable[[AsyncIterator[Any]], Any], name: str) -> None:
        self.endpoint = endpoint
        self.closed = False
        self.packs: bool | None = None  # the peer reads packed frames (its initial metadata); None before its first frame
        self._loop = asyncio.get_running_loop()  # NOTE: get_running_loop() per request costs a getpid() syscall on Python 3.11
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
        while True:
            queued = await take_ready(self._outbox)
            end = queued[-1] is None
            if end:
                queued.pop()
            if self.packs and len(queued) > 1:
                yield self._batch(queued)
            else:
                for message in queued:
                    yield message
            if end:
                return

    async def _frames(self) -> AsyncIterator[Any]:
        """What the peer sends. Its initial metadata, read with its first frame, says whether it
        reads packed frames. NOTE: read once a frame came with it: awaiting it before any frame
        turned an older scheduler's UNIMPLEMENTED into INTERNAL at times."""
        async for frame in self._call:
            if self.packs is None:
                self.packs = peer_batches(await self._call.initial_metadata())
            yield frame

    def _batch(self, messages: list[Any]) -> Any:
        """`messages` as one packed frame (the subclass's message type)."""
        raise NotImplementedError

    async def _read(self) -> None:
        raise NotImplementedError
