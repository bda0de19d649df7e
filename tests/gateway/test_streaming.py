"""EventStreamResponse: the body's end rides the stream's last event; on_close runs once."""

from __future__ import annotations

import asyncio

from kvmesh.gateway.responses import SSE_DONE
from kvmesh.gateway.streaming import EventStreamResponse


class Asgi:
    """A fake ASGI server side: records what is sent; the client leaves when `leave` is set."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.leave = asyncio.Event()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def receive(self) -> dict:
        await self.leave.wait()
        return {"type": "http.disconnect"}

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent if m["type"] == "http.response.body"]


async def serve(events, last: bytes | None, asgi: Asgi) -> list[bool]:
    closed: list[bool] = []

    async def on_close(disconnected: bool) -> None:
        closed.append(disconnected)

    await EventStreamResponse(events, on_close, last=last)({"type": "http"}, asgi.receive, asgi.send)
    return closed


def test_the_last_event_carries_the_end_of_the_body_and_the_stream_is_not_read_further():
    read_past_the_end = []

    async def events():
        yield b"data: 1\n\n"
        yield b"data: usage\n\n" + SSE_DONE
        read_past_the_end.append(True)
        yield b"data: never\n\n"

    asgi = Asgi()
    closed = asyncio.run(serve(events(), SSE_DONE, asgi))
    assert asgi.bodies() == [(b"data: 1\n\n", True), (b"data: usage\n\n" + SSE_DONE, False)]
    assert closed == [False] and not read_past_the_end


def test_without_the_marker_the_end_goes_on_its_own_after_the_stream():
    async def events():
        yield b"data: 1\n\n"
        yield SSE_DONE

    asgi = Asgi()
    closed = asyncio.run(serve(events(), None, asgi))
    assert asgi.bodies() == [(b"data: 1\n\n", True), (SSE_DONE, True), (b"", False)]
    assert closed == [False]


def test_a_stream_that_ends_without_the_marker_still_ends_the_body():
    async def events():
        yield b"data: 1\n\n"

    asgi = Asgi()
    closed = asyncio.run(serve(events(), SSE_DONE, asgi))
    assert asgi.bodies() == [(b"data: 1\n\n", True), (b"", False)]
    assert closed == [False]


def test_a_client_that_leaves_mid_stream_gets_no_end_and_on_close_hears_it():
    asgi = Asgi()

    async def events():
        yield b"data: 1\n\n"
        asgi.leave.set()
        await asyncio.sleep(10)  # the worker is slow; the client goes first
        yield SSE_DONE

    closed = asyncio.run(serve(events(), SSE_DONE, asgi))
    assert asgi.bodies() == [(b"data: 1\n\n", True)]
    assert closed == [True]
