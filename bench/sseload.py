"""A lean load generator for streamed chat completions: HTTP/1.1 keep-alive connections over
asyncio streams on uvloop, the SSE body scanned as bytes.

Why not httpx: on a small host the load generator shares the cores with the mesh it measures.
httpx (its connection pool, h11 and a line iterator per request) cost ~90 µs of CPU per output
token in bench/tokcost.py, about as much as the model itself, so the mesh's throughput there
measured the client as much as the mesh. This one parses only what the measurement needs (the
status, the end of the chunked body, the usage chunk, a count of content chunks) and costs a
fraction of that; `--client-kind httpx` in tokcost keeps the other one for comparison.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

_END = b"\r\n0\r\n\r\n"  # a chunked body's last chunk: SSE data never holds a bare CRLF, so only the end matches


async def _open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port, limit=1 << 20)


async def _response(reader: asyncio.StreamReader, first: list[float]) -> tuple[int, bytes, bool]:
    """(status, body, keep-alive) of one response: chunked (the stream) or with a length (an error).
    `first` gets the time the first content chunk arrived, if one did."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lower = head.lower()
    keep = b"connection: close" not in lower
    if b"transfer-encoding: chunked" in lower:
        body = bytearray()
        while not body.endswith(_END) and not (len(body) == 5 and body == b"0\r\n\r\n"):
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("the gateway closed the stream mid-body")
            if not first and b'"content":"' in data:
                first.append(time.perf_counter())
            body += data
        return status, bytes(body), keep
    length = 0
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length), keep


def _usage(body: bytes) -> dict | None:
    """The usage object of the stream's usage chunk (`stream_options.include_usage`), if it came."""
    at = body.rfind(b'"usage":{')
    if at < 0:
        return None
    start = body.rfind(b"data: ", 0, at) + 6
    end = body.find(b"\n", at)
    return json.loads(body[start:end])["usage"]


async def run(url: str, bodies: list[dict], concurrency: int) -> dict:
    """Sends every body (a streamed chat request) `concurrency` at a time, each worker on its own
    keep-alive connection; counts output tokens (from usage), failures and content chunks, and keeps
    each request's time to its first content chunk."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    queue = list(reversed(bodies))
    totals = {"tokens": 0, "failures": 0, "chunks": 0}
    ttfts: list[float] = []

    async def worker() -> None:
        reader = writer = None
        while queue:
            body = json.dumps(queue.pop()).encode()
            request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: " + host.encode() + b"\r\ncontent-type: "
                       b"application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            try:
                if writer is None:
                    reader, writer = await _open(host, port)
                sent, first = time.perf_counter(), []
                writer.write(request)
                status, data, keep = await _response(reader, first)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                totals["failures"] += 1
                writer = None
                continue
            usage = _usage(data) if status == 200 else None
            if usage is None:
                totals["failures"] += 1
            else:
                totals["tokens"] += usage["completion_tokens"]
                totals["chunks"] += data.count(b'"content":"')
                ttfts.extend(first[0] - sent for _ in first[:1])
            if not keep:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {**totals, "wall_s": time.perf_counter() - t0, "client_cpu_s": time.process_time() - cpu0,
            "requests": len(bodies), "ttft_s": sorted(ttfts)}


def main_sync(url: str, bodies: list[dict], concurrency: int) -> dict:
    from kvmesh.runtime.process import run_service  # uvloop, as the mesh's services run

    return run_service(run(url, bodies, concurrency))
