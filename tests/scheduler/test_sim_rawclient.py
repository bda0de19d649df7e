"""The sim's lean HTTP client (rawclient.py) against a canned HTTP/1.1 server on loopback: what it
sends, how it de-frames a chunked event stream cut anywhere, and every failure as status 0."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from kvmesh.scheduler.sim.client import CLIENT_ERROR, STREAM_ERROR, Target, new_client, served_model, stream_one
from kvmesh.scheduler.sim.rawclient import RawClient


def sse(*events: dict | str) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


def chunked(body: bytes, size: int) -> bytes:
    """`body` as a chunked transfer coding in chunks of `size` bytes (a cut anywhere in an event)."""
    out = b""
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENTS = sse({"choices": [{"text": ""}]}, {"choices": [{"text": "hé"}]}, {"choices": [{"text": "llo"}]},
             {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}}},
             "[DONE]")


class Server:
    """Answers every connection with `reply` (bytes, written at once) after reading the request."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        self.requests.append(head + await reader.readexactly(length))
        writer.write(self.reply)
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


@pytest.mark.parametrize("size", [1, 7, 1000])
async def test_a_stream_cut_anywhere_reads_as_its_events_with_usage_and_cached_tokens(size):
    async with Server(STREAM_HEAD + chunked(EVENTS, size)) as url:
        target = Target(url, "m", api_key="k")
        async with new_client(target) as client:
            assert isinstance(client, RawClient)
            outcome = await stream_one(client, target, "m", [5, 6, 7], 3, session_id="s1", arrival_s=0.0)
    assert outcome.ok and outcome.output_tokens == 3 and outcome.cached_tokens == 16
    assert not math.isnan(outcome.first_token_s)


async def test_the_request_is_one_post_with_its_headers_and_a_json_body_then_the_connection_closes():
    server = Server(STREAM_HEAD + chunked(EVENTS, 64))
    async with server as url:
        target = Target(url, "m", api_key="k")
        async with new_client(target) as client:
            await stream_one(client, target, "m", [5, 6, 7], 3, session_id="s1")
    head, body = server.requests[0].split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert headers["connection"] == "close" and headers["authorization"] == "Bearer k"
    assert headers["x-session-id"] == "s1" and int(headers["content-length"]) == len(body)
    sent = json.loads(body)
    assert sent["prompt"] == [5, 6, 7] and sent["max_tokens"] == 3 and sent["stream"] is True


async def test_an_error_status_is_kept_and_its_body_read_by_length():
    error = json.dumps({"error": {"message": "too long", "type": "invalid_request_error"}}).encode()
    reply = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(error) + error
    async with Server(reply) as url:
        target = Target(url)
        async with new_client(target) as client:
            outcome = await stream_one(client, target, "m", [1], 4)
    assert outcome.status == 400 and math.isnan(outcome.first_token_s)


@pytest.mark.parametrize("reply", [
    STREAM_HEAD + chunked(EVENTS, 16)[:40],                 # cut inside a chunk
    STREAM_HEAD + b"zz\r\n",                                 # a chunk size that is not hex
    STREAM_HEAD + b"5\r\nhelloXX",                           # a chunk without its CRLF
    b"garbage\r\n\r\n",                                      # no status line
    b"",                                                     # closed before answering
])
async def test_a_broken_response_is_a_client_error_not_a_crash(reply):
    async with Server(reply) as url:
        target = Target(url)
        async with new_client(target) as client:
            outcome = await stream_one(client, target, "m", [1], 4)
    assert outcome.status == CLIENT_ERROR


async def test_an_error_event_inside_the_stream_is_a_stream_error():
    events = sse({"choices": [{"text": "a"}]}, {"error": {"message": "worker lost"}})
    async with Server(STREAM_HEAD + chunked(events, 9)) as url:
        target = Target(url)
        async with new_client(target) as client:
            outcome = await stream_one(client, target, "m", [1], 4)
    assert outcome.status == STREAM_ERROR


async def test_a_refused_connection_is_a_client_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    target = Target(f"http://127.0.0.1:{port}")
    async with new_client(target) as client:
        outcome = await stream_one(client, target, "m", [1], 4)
    assert outcome.status == CLIENT_ERROR


async def test_the_served_model_comes_from_a_get_of_the_model_list():
    models = json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode()
    async with Server(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(models) + models) as url:
        async with new_client(Target(url)) as client:
            assert await served_model(client, Target(url)) == "tiny"


def test_https_targets_keep_httpx_and_other_schemes_are_refused():
    import httpx

    assert isinstance(new_client(Target("https://127.0.0.1:8443")), httpx.AsyncClient)
    with pytest.raises(ValueError, match="http:// URLs only"):
        RawClient("ftp://127.0.0.1:21")


def test_httpx_is_there_when_asked_for_and_an_unknown_client_is_refused():
    import httpx

    assert isinstance(new_client(Target("http://127.0.0.1:8000", client="httpx")), httpx.AsyncClient)
    with pytest.raises(ValueError, match="raw or httpx"):
        new_client(Target("http://127.0.0.1:8000", client="curl"))


@pytest.mark.parametrize("kind", ["raw", "httpx"])
async def test_both_clients_read_the_same_stream_alike(kind):
    async with Server(STREAM_HEAD + chunked(EVENTS, 5)) as url:
        target = Target(url, client=kind)
        async with new_client(target) as client:
            outcome = await stream_one(client, target, "m", [1], 3, arrival_s=0.0)
    assert (outcome.status, outcome.output_tokens, outcome.cached_tokens) == (200, 3, 16)


@pytest.mark.parametrize("reply", [b"", STREAM_HEAD, STREAM_HEAD + chunked(EVENTS, 16)[:40]])
async def test_a_gateway_that_stops_sending_is_a_client_error_after_the_timeout_not_a_hang(reply):
    """httpx's read timeout, kept: silence before the head, between chunks, or inside one."""
    release = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        await release.wait()
        writer.close()

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    target = Target(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=0.3)
    try:
        async with new_client(target) as client:
            outcome = await asyncio.wait_for(stream_one(client, target, "m", [1], 4), 10.0)
    finally:
        release.set()
        server.close()
    assert outcome.status == CLIENT_ERROR
