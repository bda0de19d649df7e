"""The one-request-per-call `Generate` RPC's path: `generate(worker, job)` yields one `Delta`
(token ids and their text) per engine step, merged when the consumer falls behind."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry import trace

from kvmesh.engine.outputs import RequestOutput, TokenLogprob
from kvmesh.runtime.telemetry import tracer
from kvmesh.worker.delivery import OutputStream

from . import metrics
from .metrics import observe_engine_times
from .worker import DecodeWorker, GenerateJob


@dataclass(slots=True)
class Delta:
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None



def merge(outs: list[RequestOutput]) -> Delta:
    delta = Delta([], "", [])
    for out in outs:
        delta.token_ids.extend(out.new_token_ids)
        delta.text += out.new_text
        delta.logprobs.extend(out.logprobs or [])
        if out.prompt_logprobs is not None:
            delta.prompt_logprobs = out.prompt_logprobs
        if out.finished:
            delta.finish_reason = out.finish_reason
            delta.prompt_tokens = out.num_prompt_tokens
            delta.completion_tokens = out.num_output_tokens
            delta.cached_tokens = out.num_cached_tokens
    return delta


async def generate(worker: DecodeWorker, job: GenerateJob) -> AsyncIterator[Delta]:
        """Validate, prefill (remote or local), then yield token deltas (with text) until the request
    finishes: one per engine step, coalesced when the consumer is slower than the engine."""
        t0 = time.monotonic()
        # NOTE: spans are ended by hand, never made current across a `yield`: the consumer may
        # close this generator from another context.
        span = tracer.start_span("decode.generate", attributes={"request_id": job.request_id})
        stream = OutputStream()
        last: RequestOutput | None = None
        try:
            if not await worker.start(job, stream.put, span):
                yield Delta([], "", [], "abort", len(job.prompt))
                return
            queue_span = tracer.start_span("decode.queue_wait", context=trace.set_span_in_context(span))
            first_step = first_token = True
            try:
                while last is None:
                    outs = await stream.next_batch()
                    if first_step:
                        first_step = False
                        queue_span.end()
                        metrics.QUEUE_WAIT.observe(time.monotonic() - t0)
                    for out in outs:
                        worker.record(job, out.new_token_ids)
                    delta = merge(outs)
                    if outs[-1].finished:
                        last = outs[-1]
                    if delta.token_ids and first_token:
                        first_token = False
                        ttft = time.monotonic() - t0
                        metrics.TTFT.observe(ttft)
                        span.set_attribute("ttft_s", ttft)
                        observe_engine_times(next(o for o in outs if o.new_token_ids), span)
                    metrics.GENERATED_TOKENS.inc(len(delta.token_ids))
                    if last is not None:
                        span.set_attribute("tokens", delta.completion_tokens)
                        span.set_attribute("finish_reason", delta.finish_reason)
                    if delta.token_ids or last is not None or delta.prompt_logprobs is not None:
                        yield delta
            finally:
                if first_step:
                    queue_span.end()
        finally:
            span.end()
            worker.finished(job, last)
