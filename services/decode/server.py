"""DecodeWorker gRPC adapter: from_pb -> DecodeWorker -> to_pb."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from kvmesh.engine.sampling import SamplingParams
from kvmesh.runtime.errors import status_for
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc
from kvmesh.runtime.grpcutil import BATCH_METADATA

from . import metrics
from .stream import StreamSession, logprobs_pb
from .generate import Delta, generate
from .worker import DecodeWorker, GenerateJob


def sampling_from_pb(p: common_pb2.SamplingParams) -> SamplingParams:
    """Proto3 zeros mean "unset" for top_p and max_tokens."""
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p or 1.0,
        top_k=p.top_k,
        seed=p.seed if p.HasField("seed") else None,
        max_tokens=p.max_tokens if p.HasField("prompt_logprobs") else (p.max_tokens or 16),
        stop=tuple(p.stop),
        stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        logprobs=p.logprobs if p.HasField("logprobs") else None,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty or 1.0,
        logit_bias=tuple(sorted(p.logit_bias.items())),
        min_tokens=p.min_tokens,
        min_p=p.min_p,
        structured=(p.structured.kind, p.structured.spec) if p.HasField("structured") else None,
        prompt_logprobs=p.prompt_logprobs if p.HasField("prompt_logprobs") else None,
        priority=p.priority,
    )


def job_from_pb(request: decode_pb2.GenerateRequest) -> GenerateJob:
    return GenerateJob(
        request_id=request.request_id,
        prompt=list(request.prompt_token_ids),
        params=sampling_from_pb(request.sampling),
        prefill_endpoint=request.prefill.endpoint if request.HasField("prefill") else "",
        kv_encoding=request.kv_encoding,
    )


def delta_to_pb(delta: Delta) -> decode_pb2.GenerateResponse:
    reply = decode_pb2.GenerateResponse(token_ids=delta.token_ids, text=delta.text)
    reply.logprobs.extend(logprobs_pb(delta.logprobs))
    reply.prompt_logprobs.extend(logprobs_pb(delta.prompt_logprobs or ()))
    if delta.finish_reason is not None:
        reply.finish_reason = delta.finish_reason
        reply.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=delta.prompt_tokens,
                completion_tokens=delta.completion_tokens,
                cached_tokens=delta.cached_tokens,
            )
        )
    return reply


class DecodeServicer(decode_pb2_grpc.DecodeWorkerServicer):
    RAW_REQUESTS = ("PushKv",)  # parsed by the worker, a block's off the event loop (`receive.read_push`)

    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker

    async def Stream(
        self, request_iterator: AsyncIterator[decode_pb2.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[decode_pb2.StepOutput]:
        """The multiplexed token stream (docs/token-stream.md)."""
        await context.send_initial_metadata((BATCH_METADATA,))  # NOTE: we read packed frames
        async for out in StreamSession(self.worker).serve(request_iterator):
            yield out

    async def Generate(
        self, request: decode_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[decode_pb2.GenerateResponse]:
        status = "ok"
        try:
            async for delta in generate(self.worker, job_from_pb(request)):
                yield delta_to_pb(delta)
        except BaseException as exc:
            status = "cancelled" if not isinstance(exc, Exception) else status_for(exc).name.lower()
            raise
        finally:
            metrics.REQUESTS.labels(status).inc()

    async def Abort(self, request: decode_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> decode_pb2.AbortResponse:
        return decode_pb2.AbortResponse(found=self.worker.abort(request.request_id))

    async def PushKv(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> decode_pb2.PushKvResponse:
        blocks, nbytes = await self.worker.receive_push(request_iterator)
        return decode_pb2.PushKvResponse(blocks_received=blocks, bytes_received=nbytes)
