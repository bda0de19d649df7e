"""What the decode suite reads streams with: a client of the multiplexed DecodeWorker.Stream
(docs/token-stream.md) that sends `generate`/`abort` and collects every request's deltas, and the
framing checks of a Stream request and of a Generate call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from kvmesh.runtime.pb import decode_pb2, decode_pb2_grpc

from .clauses import expect


class StreamClient:
    """One open Stream: `start(request)`, `abort(request_id)`, `await finished(request_id)`."""

    def __init__(self, stub: decode_pb2_grpc.DecodeWorkerStub) -> None:
        self._outbox: asyncio.Queue[decode_pb2.StreamRequest | None] = asyncio.Queue()
        self.call = stub.Stream(self._messages())
        self.deltas: dict[str, list[decode_pb2.RequestDelta]] = {}
        self.error: grpc.aio.AioRpcError | None = None
        self._reader = asyncio.create_task(self._read())

    async def _messages(self) -> AsyncIterator[decode_pb2.StreamRequest]:
        while (msg := await self._outbox.get()) is not None:
            yield msg

    async def _read(self) -> None:
        try:
            async for step in self.call:
                for delta in step.deltas:
                    self.deltas.setdefault(delta.request_id, []).append(delta)
        except grpc.aio.AioRpcError as exc:
            self.error = exc

    def start(self, request: decode_pb2.GenerateRequest) -> None:
        self._outbox.put_nowait(decode_pb2.StreamRequest(generate=request))

    def abort(self, request_id: str) -> None:
        self._outbox.put_nowait(decode_pb2.StreamRequest(abort=decode_pb2.AbortRequest(request_id=request_id)))

    def done(self, request_id: str) -> bool:
        got = self.deltas.get(request_id, [])
        return bool(got) and (bool(got[-1].finish_reason) or got[-1].error_code != 0)

    async def finished(self, request_id: str, timeout_s: float = 60.0) -> list[decode_pb2.RequestDelta]:
        """Every delta of `request_id` once its last one (finish or error) arrived."""
        for _ in range(int(timeout_s / 0.02)):
            if self.done(request_id) or self.error is not None:
                break
            await asyncio.sleep(0.02)
        expect(self.error is None, f"the Stream failed: {self.error.code().name if self.error else ''} "
                                   f"{self.error.details() if self.error else ''}")
        expect(self.done(request_id), f"request {request_id} did not finish on the Stream within {timeout_s:g}s")
        return self.deltas[request_id]

    async def first(self, request_id: str, timeout_s: float = 30.0) -> None:
        for _ in range(int(timeout_s / 0.02)):
            if self.deltas.get(request_id) or self.error is not None:
                return
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        self.call.cancel()
        self._reader.cancel()


def check_deltas(deltas: list[decode_pb2.RequestDelta], prompt_tokens: int) -> list[int]:
    """Framing of one request on the Stream; returns its token ids."""
    for i, d in enumerate(deltas[:-1]):
        expect(not d.finish_reason and not d.error_code and not d.HasField("usage"),
               f"delta {i} ends the request but is not its last")
    last = deltas[-1]
    tokens = [t for d in deltas for t in d.token_ids]
    expect(last.finish_reason in ("stop", "length", "abort") and last.HasField("usage"),
           f"last delta: finish_reason {last.finish_reason!r}, usage {'set' if last.HasField('usage') else 'missing'}")
    expect(last.usage.prompt_tokens == prompt_tokens and last.usage.completion_tokens == len(tokens),
           f"usage {last.usage.prompt_tokens}/{last.usage.completion_tokens}, expected {prompt_tokens}/{len(tokens)}")
    return tokens


async def first_error(client: StreamClient, request_id: str) -> list[decode_pb2.RequestDelta]:
    """The deltas of `request_id` once one carries an error (a duplicate's error shares the id)."""
    for _ in range(500):
        if any(d.error_code for d in client.deltas.get(request_id, [])):
            break
        await asyncio.sleep(0.02)
    errors = [d for d in client.deltas.get(request_id, []) if d.error_code]
    expect(errors, "a duplicate request id on the Stream got no error delta within 10s")
    return errors


def tokens_of(replies: list[decode_pb2.GenerateResponse]) -> list[int]:
    return [t for r in replies for t in r.token_ids]


def check_framing(replies: list[decode_pb2.GenerateResponse], prompt_tokens: int) -> None:
    """Every message but the last carries tokens and no finish; the last has finish_reason and usage."""
    expect(replies, "the stream ended without a message")
    for i, reply in enumerate(replies[:-1]):
        expect(reply.token_ids, f"message {i} carries no token ids (only the last may be empty)")
        expect(not reply.finish_reason and not reply.HasField("usage"), f"message {i} has finish_reason/usage but is not last")
    last = replies[-1]
    expect(last.finish_reason in ("stop", "length", "abort"), f"last message finish_reason {last.finish_reason!r}")
    expect(last.HasField("usage"), "last message has no usage")
    expect(last.usage.prompt_tokens == prompt_tokens, f"usage.prompt_tokens {last.usage.prompt_tokens}, prompt has {prompt_tokens}")
    expect(last.usage.completion_tokens == len(tokens_of(replies)),
           f"usage.completion_tokens {last.usage.completion_tokens}, stream carried {len(tokens_of(replies))}")


async def rest_of(call) -> list[decode_pb2.GenerateResponse]:  # noqa: ANN001 - a call already read from
    """The rest of a Generate call's messages (after `read()` was used on it)."""
    out = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        out.append(msg)
    return out
