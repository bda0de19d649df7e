"""The OpenAI-API client side of `kvmesh sim replay` and `kvmesh sim calibrate`: one streaming
`/v1/completions` request with a token-id prompt, timed from the outside.

Every request asks for exactly `max_tokens` tokens (`ignore_eos`, greedy), streams, and reports
its usage (`stream_options.include_usage`), so the output length is the trace's and the cached
prompt tokens come from the gateway. A failed request keeps its HTTP status; a connection error
or timeout is status 0, an error inside the stream 500.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .rawclient import RawClient
from .report import Outcome

CLIENT_ERROR = 0     # the request never got an HTTP answer (connection refused, timeout)
STREAM_ERROR = 500   # the stream broke off or carried an error event


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: the gateway's base URL (…:8000, without /v1) and the served model; `client`
    is how: "raw" (rawclient.py; httpx for an https URL) or "httpx"."""

    url: str
    model: str = ""
    api_key: str = ""
    timeout_s: float = 120.0
    client: str = "raw"


async def served_model(client, target: Target) -> str:  # noqa: ANN001 - new_client's: RawClient or httpx.AsyncClient
    """The model to name in requests: the target's, or the gateway's first in /v1/models."""
    if target.model:
        return target.model
    response = await client.get(f"{target.url}/v1/models", headers=_headers(target, ""))
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def _headers(target: Target, session_id: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    if session_id:
        headers["X-Session-Id"] = session_id
    return headers


def unreachable(exc: BaseException) -> bool:
    """True for the errors of a gateway that is not there or not serving (for a clear exit)."""
    import httpx  # noqa: PLC0415

    return isinstance(exc, (httpx.HTTPError, OSError, KeyError, IndexError, ValueError))


def new_client(target: Target, connections: int = 1024):  # noqa: ANN201 - RawClient or httpx.AsyncClient
    """The lean client (rawclient.py) for an http:// gateway; httpx for https (TLS) or when asked for."""
    if target.client not in ("raw", "httpx"):
        raise ValueError(f"client must be raw or httpx, not {target.client!r}")
    if target.client == "raw" and target.url.startswith("http://"):
        return RawClient(target.url, target.timeout_s)
    import httpx  # noqa: PLC0415 - only the replay/calibrate commands need it

    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(target.timeout_s, connect=10.0))


async def stream_one(client, target: Target, model: str, prompt: list[int], max_tokens: int,  # noqa: ANN001
                     session_id: str = "", arrival_s: float | None = None, clock=time.perf_counter,
                     token_times: list[float] | None = None, hidden: list[int] | None = None) -> Outcome:
    """Sends one request now; times are on `clock`, `arrival_s` (default: now) is its arrival;
    `token_times`, if given, gets the arrival time of every streamed chunk.

    With `hidden` (a list), the request asks for the chosen tokens' logprobs, so every token comes
    in a chunk even when its text is empty: the TTFT is then the first token's, not the first
    visible text's, and `hidden` gets how many tokens came before the first text (the gateway
    sends no chunk for a token whose text is held back: a byte of an unfinished UTF-8 character,
    a skipped special token), or `max_tokens` when none had text."""
    import httpx  # noqa: PLC0415

    start = clock() if arrival_s is None else arrival_s
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if hidden is not None:
        body["logprobs"] = 0
    before_text: int | None = None
    seen = 0
    first, tokens, cached, status = math.nan, 0, 0, 200
    try:
        async with client.stream("POST", f"{target.url}/v1/completions", content=json.dumps(body).encode(),
                                 headers=_headers(target, session_id)) as response:
            if response.status_code != 200:
                await response.aread()
                return Outcome(start, len(prompt), max_tokens, math.nan, clock(), 0, response.status_code)
            done = False
            async for line in sse_lines(response.aiter_bytes()):
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    # NOTE: leaves the body's end unread, so httpx closes the connection and the next request
                    # opens its own. Reading on to reuse it was tried (2026-12-02): 24 requests sent at once then
                    # took 110-250 ms to their last first token against 55-78, and the calibration's mesh-wide
                    # request work tripled; the probes and the replay both pay a new connection, alike
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    status = STREAM_ERROR
                    break
                if chunk.get("choices"):
                    now = clock()
                    first = now if math.isnan(first) else first
                    if token_times is not None:
                        token_times.append(now)
                    if hidden is not None and before_text is None:
                        choice = chunk["choices"][0]
                        if choice.get("text"):
                            before_text = seen
                        seen += len((choice.get("logprobs") or {}).get("tokens") or ())
                usage = chunk.get("usage")
                if usage:
                    tokens = usage.get("completion_tokens", 0)
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if not done and status == 200:
                status = STREAM_ERROR
    except (httpx.HTTPError, OSError, asyncio.TimeoutError):
        status = CLIENT_ERROR
    if hidden is not None and status == 200:
        hidden.append(max_tokens if before_text is None else before_text)
    return Outcome(start, len(prompt), tokens or max_tokens, first, clock(), cached, status)


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream, split at \\n, \\r\\n or \\r only (the SSE line ends).

    NOTE: httpx's `aiter_lines` splits like `str.splitlines`, also at U+0085, U+2028 and U+2029,
    which JSON leaves unescaped inside strings: a token that decodes to one of them cut its chunk's
    JSON in two and failed the calibration's probes (random-token outputs of 256 tokens hit it)."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")
