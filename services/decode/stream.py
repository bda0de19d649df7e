"""The worker side of the multiplexed token stream (`DecodeWorker.Stream`, docs/token-stream.md).

One `StreamSession` serves one gateway's stream: `generate` messages start requests, `abort`
messages stop them, and every engine step's outputs for this stream's requests leave as ONE
`StepOutput`. A request's new tokens wait in its own `RequestDelta` until the writer takes them,
so a stream whose reader is slow gets fewer, larger messages instead of a backlog;
`stream_interval` > 1 also holds a request's tokens until that many are pending (its first token
and its end are never held).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from kvmesh.engine.outputs import RequestOutput
from kvmesh.runtime.errors import MeshError, status_for
from kvmesh.runtime.pb import common_pb2, decode_pb2
from kvmesh.runtime.telemetry import extract_context, tracer

from . import metrics
from .worker import DecodeWorker, GenerateJob

log = logging.getLogger(__name__)


class _Run:
    """One request on the stream: its pending delta, span and timings."""

    __slots__ = ("job", "span", "t0", "delta", "unsent", "sent_any", "done")

    def __init__(self, job: GenerateJob, span: trace.Span) -> None:
        self.job = job
        self.span = span
        self.t0 = time.monotonic()
        self.delta: decode_pb2.RequestDelta | None = None
        self.unsent = 0  # tokens in `delta`
        self.sent_any = False
        self.done = False

    def pending(self) -> decode_pb2.RequestDelta:
        if self.delta is None:
            self.delta = decode_pb2.RequestDelta(request_id=self.job.request_id)
        return self.delta


class StreamSession:
    """Serves one `Stream` call; see the module docstring."""

    def __init__(self, worker: DecodeWorker, stream_interval: int = 1) -> None:
        self.worker = worker
        self.stream_interval = max(1, stream_interval)
        self._runs: dict[str, _Run] = {}
        self._ready: dict[str, _Run] = {}  # runs whose delta should go out with the next message
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._reading = True

    async def serve(self, requests: AsyncIterator[decode_pb2.StreamRequest]) -> AsyncIterator[decode_pb2.StepOutput]:
        reader = asyncio.create_task(self._read(requests), name="decode-stream-reader")
        try:
            while self._reading or self._runs or self._ready:
                await self._wake.wait()
                self._wake.clear()
                if self._ready:
                    ready, self._ready = self._ready, {}
                    out = decode_pb2.StepOutput()
                    for run in ready.values():
                        out.deltas.append(run.delta)
                        run.delta, run.unsent, run.sent_any = None, 0, True
                    yield out
                if reader.done() and reader.exception() is not None:
                    raise reader.exception()
        finally:
            reader.cancel()
            for task in self._tasks:
                task.cancel()
            for run in list(self._runs.values()):
                self._end(run, None, "cancelled")

    async def _read(self, requests: AsyncIterator[decode_pb2.StreamRequest]) -> None:
        try:
            async for msg in requests:
                kind = msg.WhichOneof("msg")
                if kind == "generate":
                    self._start(msg.generate)
                elif kind == "abort":
                    self.worker.abort(msg.abort.request_id)
        finally:
            self._reading = False
            self._wake.set()

    def _start(self, request: decode_pb2.GenerateRequest) -> None:
        from .server import job_from_pb  # noqa: PLC0415 - server imports this module

        job = job_from_pb(request)
        job.detokenize = False
        # NOTE: always this request's own context (empty = a new trace), never the stream's.
        ctx = extract_context(dict(request.trace_context))
        span = tracer.start_span("decode.generate", context=ctx, attributes={"request_id": job.request_id})
        if not job.request_id or job.request_id in self._runs:
            self._fail(_Run(job, span), MeshError("request_id must be set and unique on the stream"))
            return
        run = self._runs[job.request_id] = _Run(job, span)
        task = asyncio.create_task(self._open(run), name=f"decode-open-{job.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, run: _Run) -> None:
        try:
            if not await self.worker.start(run.job, lambda out: self._on_output(run, out), run.span):
                self._finish(run, None, "abort")
        except MeshError as exc:
            self._fail(run, exc)
        except Exception as exc:  # noqa: BLE001 - this request fails, the stream goes on
            log.exception("starting %s failed", run.job.request_id)
            self._fail(run, exc)

    def _on_output(self, run: _Run, out: RequestOutput | BaseException) -> None:
        if run.done:
            return
        if isinstance(out, BaseException):
            self._fail(run, out)
            return
        self.worker.record(run.job, out)
        if out.new_token_ids:
            delta = run.pending()
            delta.token_ids.extend(out.new_token_ids)
            if out.logprobs:
                delta.logprobs.extend(_logprobs_pb(out.logprobs))
            if not run.sent_any and run.unsent == 0:
                delta.cached_tokens = out.num_cached_tokens
                ttft = time.monotonic() - run.t0
                metrics.TTFT.observe(ttft)
                run.span.set_attribute("ttft_s", ttft)
            run.unsent += len(out.new_token_ids)
            metrics.GENERATED_TOKENS.inc(len(out.new_token_ids))
        if out.finished:
            self._finish(run, out, out.finish_reason or "stop")
        elif run.unsent and (run.unsent >= self.stream_interval or not run.sent_any):
            self._mark_ready(run)

    def _finish(self, run: _Run, out: RequestOutput | None, reason: str) -> None:
        delta = run.pending()
        delta.finish_reason = reason
        prompt = len(run.job.prompt)
        if out is not None:
            delta.usage.CopyFrom(common_pb2.Usage(
                prompt_tokens=out.num_prompt_tokens, completion_tokens=out.num_output_tokens,
                cached_tokens=out.num_cached_tokens,
            ))
        else:
            delta.usage.CopyFrom(common_pb2.Usage(prompt_tokens=prompt))
        run.span.set_attribute("finish_reason", reason)
        run.span.set_attribute("tokens", delta.usage.completion_tokens)
        self._mark_ready(run)
        self._end(run, out, "ok")

    def _fail(self, run: _Run, exc: BaseException) -> None:
        code = status_for(exc) if isinstance(exc, Exception) else None
        delta = run.pending()
        delta.error_code = code.value[0] if code is not None else grpc.StatusCode.INTERNAL.value[0]
        delta.error_message = str(exc) or type(exc).__name__
        retry = getattr(exc, "retry_after_s", None)
        if retry:
            delta.retry_after_s = retry
        run.span.set_status(trace.Status(trace.StatusCode.ERROR, delta.error_message))
        self._mark_ready(run)
        self._end(run, None, code.name.lower() if code is not None else "internal")

    def _mark_ready(self, run: _Run) -> None:
        self._ready[run.job.request_id] = run
        self._wake.set()

    def _end(self, run: _Run, out: RequestOutput | None, status: str) -> None:
        if run.done:
            return
        run.done = True
        if self._runs.get(run.job.request_id) is run:
            del self._runs[run.job.request_id]
        self.worker.finished(run.job, out)
        metrics.REQUESTS.labels(status).inc()
        run.span.end()


def _logprobs_pb(entries) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            token_id=lp.token_id, logprob=lp.logprob,
            top=[common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top_logprobs],
        )
        for lp in entries
    ]
