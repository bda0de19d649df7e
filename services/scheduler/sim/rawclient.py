"""A lean HTTP/1.1 client for `kvmesh sim replay` and `kvmesh sim calibrate` against a plain-HTTP
gateway: one connection per request (`Connection: close`, as the httpx client's use here amounts
to, client.py says why) over asyncio streams, the chunked body de-framed by hand.

Why not httpx here: the replay's client shares the host with the mesh it times. httpx (its pool,
h11 and its async machinery per chunk) cost 12.6-14.5 ms of CPU a replayed request against this
one's 7.8 (bench/replayclient.py: the fidelity trace, 2 workers, 13.5 req/s). That CPU is taken
from the mesh. The lean client's TTFT p50 was 6-16 ms lower in 4 of 5 alternating rounds, and equal
in one. This one reads a status line, headers and chunk sizes, nothing more. It copies the slice of
httpx's API the sim's client uses (`stream`, `get`, `status_code`, `aiter_bytes`, `aread`, `json`,
`raise_for_status`), so client.py's code reads the same over either; https targets keep httpx.

Every failure of the connection or of the response's framing, and a read that waits longer than
the client's `timeout_s` for its bytes (httpx's read timeout), is a `ConnectionError` (an
`OSError`), which the callers count as status 0, like httpx's transport errors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

_LIMIT = 1 << 20             # the longest header block or chunk-size line read in one piece
_HEAD_END = b"\r\n\r\n"
_CRLF = b"\r\n"


class _TimedReader:
    """A StreamReader whose every read fails after `timeout_s` without its bytes."""

    def __init__(self, reader: asyncio.StreamReader, timeout_s: float) -> None:
        self._reader = reader
        self._timeout_s = timeout_s

    async def _timed(self, read):  # noqa: ANN001, ANN202 - an awaitable read; its bytes
        try:
            async with asyncio.timeout(self._timeout_s):
                return await read
        except TimeoutError as exc:
            raise ConnectionError(f"no response bytes for {self._timeout_s:g} s") from exc

    async def readuntil(self, separator: bytes) -> bytes:
        return await self._timed(self._reader.readuntil(separator))

    async def readexactly(self, n: int) -> bytes:
        return await self._timed(self._reader.readexactly(n))

    async def read(self) -> bytes:
        return await self._timed(self._reader.read())


class RawResponse:
    """One response: its status and headers read, its body not yet."""

    def __init__(self, status: int, headers: dict[str, str], reader: _TimedReader) -> None:
        self.status_code = status
        self.headers = headers
        self._reader = reader

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come: chunk by chunk when chunked, else up to its length or EOF."""
        try:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                while True:
                    line = await self._reader.readuntil(_CRLF)
                    size = int(line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        return
                    data = await self._reader.readexactly(size + 2)
                    if not data.endswith(_CRLF):
                        raise ValueError("a chunk does not end in CRLF")
                    yield data[:-2]
            elif "content-length" in self.headers:
                yield await self._reader.readexactly(int(self.headers["content-length"]))
            else:
                yield await self._reader.read()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ConnectionError(f"a malformed or cut-off response body: {exc!r}") from exc

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_bytes()])


class _ReadResponse:
    """A response whose body was read whole (RawClient.get)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.content = body

    def json(self):  # noqa: ANN201
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if not 200 <= self.status_code < 300:
            raise ConnectionError(f"HTTP {self.status_code}: {self.content[:200]!r}")


class RawClient:
    """Requests to one `http://host:port` base; an async context manager like httpx.AsyncClient."""

    def __init__(self, base_url: str, timeout_s: float = 120.0, connect_timeout_s: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"RawClient serves http:// URLs only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _path(self, url: str) -> str:
        parts = urlsplit(url)
        if parts.netloc and parts.netloc != self.authority:
            raise ValueError(f"RawClient for {self.authority} asked for {url!r}")
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    @asynccontextmanager
    async def stream(self, method: str, url: str, content: bytes = b"",
                     headers: dict[str, str] | None = None) -> AsyncIterator[RawResponse]:
        """Sends the request and yields the response once its headers are in; closes the connection after."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=_LIMIT), self.connect_timeout_s)
        except asyncio.TimeoutError as exc:
            raise ConnectionError(f"connecting to {self.authority} timed out") from exc
        try:
            lines = [f"{method} {self._path(url)} HTTP/1.1", f"Host: {self.authority}", "Connection: close",
                     f"Content-Length: {len(content)}"]
            lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content)
            yield await _read_head(_TimedReader(reader, self.timeout_s))
        finally:
            writer.close()

    async def get(self, url: str, headers: dict[str, str] | None = None) -> _ReadResponse:
        async with self.stream("GET", url, headers=headers) as response:
            return _ReadResponse(response.status_code, await response.aread())


async def _read_head(reader: _TimedReader) -> RawResponse:
    try:
        head = await reader.readuntil(_HEAD_END)
        status_line, *header_lines = head[: -len(_HEAD_END)].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
        raise ConnectionError(f"no valid HTTP response head: {exc!r}") from exc
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers, reader)
