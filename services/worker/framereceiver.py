"""Frames from an engine process, received straight into memory (`asyncio.BufferedProtocol`).

An `asyncio.StreamReader` copied every byte three more times on the way to `enginewire.split`:
into its growing buffer, out as a slice and as bytes, then into the blobs' own bytearray. A hand-back
batch's reply (its turns' KV blocks, ~2 MiB on `tiny`) made each of those a fresh allocation, and
fresh pages fault: the worker's process took 2,000-3,000 minor faults receiving one (README, "The
token path"). Here small frames (step outputs, replies) arrive in one reused scratch buffer and
only their blobs are copied out (as `split` did); a frame larger than the scratch gets a buffer of
its exact size, the socket writes into it directly, and its blobs are a view of it: no copy at all.
"""

from __future__ import annotations

import asyncio
import collections

from . import enginewire as wire

SCRATCH_BYTES = 256 * 1024  # the reused receive buffer; a larger frame gets its own
PAUSE_FRAMES = 256  # frames received and not yet read: past this the socket's reading pauses


class FrameReceiver(asyncio.BufferedProtocol):
    """Receives `enginewire` frames; `await read()` returns the next (header, blobs)."""

    def __init__(self, scratch_bytes: int | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(max(scratch_bytes or SCRATCH_BYTES, wire.PREFIX.size))
        self.large_frames = 0  # frames received into a buffer of their own
        self._have = 0  # bytes of the scratch holding received data
        self._body: bytearray | None = None  # a large frame's own buffer, being filled
        self._body_got = 0
        self._body_header = 0  # its header's length
        self._frames: collections.deque[tuple[dict, wire.Blobs]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: BaseException | None = None  # why no more frames will come
        self._paused = False

    # -- the protocol (the transport calls these) ------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._body_got:]
        return memoryview(self._scratch)[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is not None:
            self._body_got += nbytes
            if self._body_got == len(self._body):
                body, self._body = self._body, None
                self._deliver(wire.split(body, self._body_header, copy=False))
            return
        self._have += nbytes
        self._take_frames()

    def eof_received(self) -> bool:
        self._close(asyncio.IncompleteReadError(b"", None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._close(asyncio.IncompleteReadError(b"", None))
        else:
            self._close(exc if isinstance(exc, ConnectionError) else ConnectionError(f"engine socket lost: {exc}"))

    # -- the reader's side ----------------------------------------------------------------------
    async def read(self) -> tuple[dict, wire.Blobs]:
        """The next frame; asyncio.IncompleteReadError at EOF, or the error the connection was lost with."""
        while not self._frames:
            if self._closed is not None:
                raise self._closed
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._paused and len(self._frames) <= PAUSE_FRAMES // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return self._frames.popleft()

    # -- internals ------------------------------------------------------------------------------
    def _take_frames(self) -> None:
        """Every whole frame in the scratch out; a large frame's start moved to its own buffer; the
        rest moved to the scratch's front."""
        frames, pos = wire.take_frames(self._scratch, self._have)
        for frame in frames:
            self._deliver(frame)
        with memoryview(self._scratch) as view:
            if self._have - pos >= wire.PREFIX.size:
                header_len, blobs_len = wire.PREFIX.unpack_from(self._scratch, pos)
                start, size = pos + wire.PREFIX.size, header_len + blobs_len
                if wire.PREFIX.size + size > len(self._scratch):
                    self.large_frames += 1
                    self._body = bytearray(size)
                    self._body_got, self._body_header = self._have - start, header_len
                    self._body[:self._body_got] = view[start:self._have]
                    pos = self._have
            if pos:
                rest = self._have - pos
                self._scratch[:rest] = view[pos:self._have]
                self._have = rest

    def _deliver(self, frame: tuple[dict, wire.Blobs]) -> None:
        self._frames.append(frame)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if not self._paused and len(self._frames) > PAUSE_FRAMES and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _close(self, exc: BaseException) -> None:
        if self._closed is None:
            self._closed = exc
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
