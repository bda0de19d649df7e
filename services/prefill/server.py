"""PrefillWorker gRPC adapter: from_pb -> PrefillWorker -> to_pb."""

from __future__ import annotations

import time

import grpc

from kvmesh.runtime.errors import status_for
from kvmesh.runtime.pb import prefill_pb2, prefill_pb2_grpc

from . import metrics
from .worker import PrefillJob, PrefillWorker


def job_from_pb(request: prefill_pb2.PrefillRequest) -> PrefillJob:
    return PrefillJob(
        request_id=request.request_id,
        prompt=list(request.prompt_token_ids),
        destination=request.destination.endpoint,
        start_block=request.start_block,
        encoding=request.encoding,
    )


class PrefillServicer(prefill_pb2_grpc.PrefillWorkerServicer):
    def __init__(self, worker: PrefillWorker) -> None:
        self.worker = worker

    async def Prefill(self, request: prefill_pb2.PrefillRequest, context: grpc.aio.ServicerContext) -> prefill_pb2.PrefillResponse:
        t0, status = time.monotonic(), "ok"
        try:
            result = await self.worker.prefill(job_from_pb(request))
        except BaseException as exc:
            status = "cancelled" if not isinstance(exc, Exception) else status_for(exc).name.lower()
            raise
        finally:
            metrics.REQUESTS.labels(status).inc()
            metrics.SECONDS.observe(time.monotonic() - t0)
        return prefill_pb2.PrefillResponse(
            num_computed_tokens=result.num_computed_tokens,
            num_cached_tokens=result.num_cached_tokens,
            blocks_pushed=result.blocks_pushed,
            bytes_pushed=result.bytes_pushed,
        )
