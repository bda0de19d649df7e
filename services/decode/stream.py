"""The worker side of the multiplexed token stream (`DecodeWorker.Stream`, docs/token-stream.md).

One `StreamSession` serves one gateway's stream: `generate` messages start requests, `abort`
messages stop them, and every engine step's outputs for this stream's requests leave as ONE
`StepOutput`. A request's new tokens wait in its own `RequestDelta` until the writer takes them,
so a stream whose reader is slow gets fewer, larger messages instead of a backlog. What reaches
this session is already due: under load the engine loop holds a request's tokens and lets them go
every `stream_interval` steps (`kvmesh.worker.outputhold`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from opentelemetry import trace

from kvmesh.engine.outputs import RequestOutput
from kvmesh.runtime.errors import InvalidArgument
from kvmesh.runtime.grpcutil import error_status, unpacked
from kvmesh.runtime.pb import common_pb2, decode_pb2
from kvmesh.runtime.telemetry import extract_context, tracer

from . import metrics
from .metrics import observe_engine_times
from .worker import DecodeWorker, GenerateJob



class _Run:
    """One request on the stream: what it has pending for the next message, its span and timings.

    NOTE: pending output is kept in plain lists and turned into a `RequestDelta` only by the
    writer, in place inside the outgoing `StepOutput` (no message per request per step, no copy).
    """

    __slots__ = ("job", "span", "t0", "tokens", "logprobs", "prompt_logprobs", "cached_tokens", "finish_reason",
                 "usage", "error", "sent_any", "done", "abort_asked")

    def __init__(self, job: GenerateJob, span: trace.Span) -> None:
        self.job = job
        self.span = span
        self.t0 = time.monotonic()
        self.tokens: list[int] = []  # pending token ids
        self.logprobs: list = []  # pending engine TokenLogprobs (one per pending token, when asked for)
        self.prompt_logprobs: list | None = None
        self.cached_tokens = 0
        self.finish_reason = ""
        self.usage: tuple[int, int, int] | None = None  # prompt, completion, cached: with the finish
        self.error: tuple[int, str, float] | None = None  # code, message, retry_after_s: instead of a finish
        self.sent_any = False
        self.done = False
        self.abort_asked = False  # an abort came before the request reached the worker

    def write(self, delta: decode_pb2.RequestDelta) -> None:
        """Fill `delta` (fresh, inside the outgoing message) with what is pending; clear it."""
        delta.request_id = self.job.request_id
        if self.tokens:
            delta.token_ids.extend(self.tokens)
            if not self.sent_any:
                delta.cached_tokens = self.cached_tokens
            self.tokens = []
        if self.logprobs:
            delta.logprobs.extend(logprobs_pb(self.logprobs))
            self.logprobs = []
        if self.prompt_logprobs is not None:
            delta.prompt_logprobs.extend(logprobs_pb(self.prompt_logprobs))
            self.prompt_logprobs = None
        if self.error is not None:
            delta.error_code, delta.error_message, retry = self.error
            if retry:
                delta.retry_after_s = retry
        elif self.finish_reason:
            delta.finish_reason = self.finish_reason
            if self.usage is not None:
                u = delta.usage
                u.prompt_tokens, u.completion_tokens, u.cached_tokens = self.usage
        self.sent_any = True


class StreamSession:
    """Serves one `Stream` call; see the module docstring."""

    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker
        self._runs: dict[str, _Run] = {}
        # NOTE: keyed by the run itself, not its request id: a duplicate id's error run and the
        # running request of that id can both be ready for one message, and each needs its delta.
        self._ready: dict[_Run, None] = {}  # runs whose delta should go out with the next message (in order)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._reading = True
        self._generated = 0  # tokens not yet counted in the metric (counted once per message)

    async def serve(self, requests: AsyncIterator[decode_pb2.StreamRequest]) -> AsyncIterator[decode_pb2.StepOutput]:
        reader = asyncio.create_task(self._read(requests), name="decode-stream-reader")
        try:
            while self._reading or self._runs or self._ready:
                await self._wake.wait()
                self._wake.clear()
                if self._ready:
                    ready, self._ready = self._ready, {}
                    out = decode_pb2.StepOutput()
                    add = out.deltas.add
                    for run in ready:
                        run.write(add())
                    if self._generated:
                        metrics.GENERATED_TOKENS.inc(self._generated)
                        self._generated = 0
                    metrics.STREAM_MESSAGES.inc()
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
                metrics.STREAM_FRAMES.labels(msg.WhichOneof("msg") or "empty").inc()
                for frame in unpacked(msg):
                    self._handle(frame)
        finally:
            self._reading = False
            self._wake.set()

    def _handle(self, msg: decode_pb2.StreamRequest) -> None:
        kind = msg.WhichOneof("msg")
        if kind == "generate":
            self._start(msg.generate)
        elif kind == "abort":
            run = self._runs.get(msg.abort.request_id)
            if run is not None:
                run.abort_asked = True
            self.worker.abort(msg.abort.request_id)

    def _start(self, request: decode_pb2.GenerateRequest) -> None:
        from .server import job_from_pb  # noqa: PLC0415 - server imports this module

        job = job_from_pb(request)
        job.detokenize = False
        # NOTE: always this request's own context (empty = a new trace), never the stream's.
        ctx = extract_context(dict(request.trace_context))
        span = tracer.start_span("decode.generate", context=ctx, attributes={"request_id": job.request_id})
        if not job.request_id or job.request_id in self._runs:
            self._fail(_Run(job, span), InvalidArgument("request_id must be set and unique on the stream"))
            return
        run = self._runs[job.request_id] = _Run(job, span)
        task = asyncio.create_task(self._open(run), name=f"decode-open-{job.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, run: _Run) -> None:
        try:
            if not await self.worker.start(run.job, lambda out: self._on_output(run, out), run.span):
                self._finish(run, None, "abort")
            elif run.abort_asked:  # NOTE: the abort overtook the request on its way in
                self.worker.abort(run.job.request_id)
        except Exception as exc:  # noqa: BLE001 - this request fails, the stream goes on
            self._fail(run, exc, log_unexpected=True)

    def _on_output(self, run: _Run, out: RequestOutput | BaseException) -> None:
        if run.done:
            return
        if isinstance(out, BaseException):
            self._fail(run, out)
            return
        new = out.new_token_ids
        if new:
            self.worker.record(run.job, new)
            if not run.sent_any and not run.tokens:
                run.cached_tokens = out.num_cached_tokens
                ttft = time.monotonic() - run.t0
                metrics.TTFT.observe(ttft)
                run.span.set_attribute("ttft_s", ttft)
                observe_engine_times(out, run.span)
            run.tokens += new
            if out.logprobs:
                run.logprobs += out.logprobs
            self._generated += len(new)
        if out.prompt_logprobs is not None:  # on the request's first output (with a token or its end)
            run.prompt_logprobs = list(out.prompt_logprobs)
        if out.finished:
            self._finish(run, out, out.finish_reason or "stop")
        elif run.tokens:
            self._mark_ready(run)

    def _finish(self, run: _Run, out: RequestOutput | None, reason: str) -> None:
        run.finish_reason = reason
        if out is not None:
            run.usage = (out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
        else:
            run.usage = (len(run.job.prompt), 0, 0)
        run.span.set_attribute("finish_reason", reason)
        run.span.set_attribute("tokens", run.usage[1])
        self._mark_ready(run)
        self._end(run, out, "ok")

    def _fail(self, run: _Run, exc: BaseException, log_unexpected: bool = False) -> None:
        """The request ends with `exc`'s status; an unexpected error's text stays in the log (the
        engine loop logged a failed step already), the caller gets "internal error: <type>"."""
        code, message = error_status(exc, log_unexpected)
        run.error = (code.value[0], message, getattr(exc, "retry_after_s", None) or 0.0)
        run.span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        self._mark_ready(run)
        self._end(run, None, code.name.lower())

    def _mark_ready(self, run: _Run) -> None:
        self._ready[run] = None
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


def logprobs_pb(entries) -> list[common_pb2.TokenLogprob]:
    """Engine TokenLogprobs as protobuf."""
    return [
        common_pb2.TokenLogprob(
            token_id=lp.token_id, logprob=lp.logprob,
            top=[common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top_logprobs],
        )
        for lp in entries
    ]
