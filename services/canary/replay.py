"""Replaying mirrored requests: route on a named pool, generate with the same prompt, sampling and
seed, time it. `ReplayLoop` pulls jobs from the buffer with bounded concurrency, so a slow
candidate only makes records wait (and the buffer drop) - it never slows production."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import grpc

from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.pb import decode_pb2, decode_pb2_grpc, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from kvmesh.runtime.telemetry import inject_metadata, tracer

from .compare import Outcome
from .state import CanaryState, Job

log = logging.getLogger(__name__)

COMPLETE_TIMEOUT_S = 5.0


def _rpc_error(step: str, exc: grpc.aio.AioRpcError) -> str:
    return f"{step}: {exc.code().name}: {exc.details() or ''}".rstrip(": ")


class Replayer:
    """Runs one record on one pool through the scheduler and a decode worker."""

    def __init__(
        self,
        scheduler: scheduler_pb2_grpc.SchedulerStub,
        channels: ChannelPool,
        timeout_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._scheduler = scheduler
        self._channels = channels
        self._timeout_s = timeout_s
        self._clock = clock

    async def replay(self, record: events_pb2.MirrorRecord, pool: str, request_id: str) -> Outcome:
        with tracer.start_as_current_span("canary.replay") as span:
            span.set_attribute("kvmesh.request_id", request_id)
            span.set_attribute("kvmesh.mirrored_request_id", record.request_id)
            span.set_attribute("kvmesh.pool", pool)
            outcome = await self._replay(record, pool, request_id)
            span.set_attribute("kvmesh.output_tokens", len(outcome.token_ids))
            if outcome.error:
                span.set_attribute("kvmesh.error", outcome.error)
            return outcome

    async def _replay(self, record: events_pb2.MirrorRecord, pool: str, request_id: str) -> Outcome:
        start = self._clock()
        deadline = start + self._timeout_s
        try:
            route = await self._scheduler.Route(
                scheduler_pb2.RouteRequest(
                    request_id=request_id,
                    session_id=record.session_id,
                    model=record.model,
                    num_prompt_tokens=len(record.prompt_token_ids),
                    max_tokens=record.sampling.max_tokens,
                    pool=pool,
                ),
                timeout=self._timeout_s,
                metadata=inject_metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            return Outcome((), 0.0, 0.0, _rpc_error("route", exc))
        tokens: list[int] = []
        first: float | None = None
        last = 0.0
        status, error = "error", ""
        try:
            request = decode_pb2.GenerateRequest(
                request_id=request_id,
                prompt_token_ids=record.prompt_token_ids,
                sampling=record.sampling,
                session_id=record.session_id,
            )
            if not route.local_prefill and route.HasField("prefill"):
                request.prefill.CopyFrom(route.prefill)
            stub = decode_pb2_grpc.DecodeWorkerStub(self._channels.get(route.decode.endpoint))
            call = stub.Generate(request, timeout=max(0.001, deadline - self._clock()), metadata=inject_metadata())
            async for response in call:
                if response.token_ids:
                    last = self._clock()
                    first = last if first is None else first
                    tokens.extend(response.token_ids)
            status = "ok"
        except grpc.aio.AioRpcError as exc:
            error = _rpc_error("generate", exc)
        except asyncio.CancelledError:
            status = "aborted"
            raise
        finally:
            await self._complete(request_id, status)
        if first is None:
            return Outcome((), 0.0, 0.0, error)
        tpot = (last - first) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
        return Outcome(tuple(tokens), first - start, tpot, error)

    async def _complete(self, request_id: str, status: str) -> None:
        try:
            await self._scheduler.Complete(
                scheduler_pb2.CompleteRequest(request_id=request_id, status=status),
                timeout=COMPLETE_TIMEOUT_S,
                metadata=inject_metadata(),
            )
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            log.debug("Complete(%s) did not reach the scheduler", request_id)


class ReplayLoop:
    """`max_concurrency` workers take jobs from the state's buffer; each job is replayed on the
    candidate and, with probability `noise_sample`, on production too (the noise floor)."""

    def __init__(
        self,
        state: CanaryState,
        replayer: Replayer,
        max_concurrency: int,
        noise_sample: float,
        rng: random.Random | None = None,
    ) -> None:
        self._state = state
        self._replayer = replayer
        self._max_concurrency = max_concurrency
        self._noise_sample = noise_sample
        self._rng = rng or random.Random()
        self._wakeup = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.inflight = 0

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work(), name=f"canary-replay-{i}") for i in range(self._max_concurrency)]

    def notify(self) -> None:
        """A record was buffered."""
        self._wakeup.set()

    async def _work(self) -> None:
        while not self._stopping:
            job = self._state.next_job()
            if job is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self.inflight += 1
            try:
                await self._run(job)
            except Exception:  # noqa: BLE001 - one bad replay must not stop the loop
                log.exception("replay of %s failed", job.record.request_id)
            finally:
                self.inflight -= 1

    async def _run(self, job: Job) -> None:
        request_id = job.record.request_id
        replays = [self._replayer.replay(job.record, job.pools.candidate, f"canary-{request_id}")]
        with_noise = self._noise_sample > 0 and self._rng.random() < self._noise_sample
        if with_noise:
            replays.append(self._replayer.replay(job.record, job.pools.production, f"canary-noise-{request_id}"))
        outcomes = await asyncio.gather(*replays)
        self._state.record_candidate(job, outcomes[0])
        if with_noise:
            self._state.record_noise(job, outcomes[1])

    async def stop(self, grace_s: float) -> None:
        """Lets replays in flight finish for up to `grace_s`, then cancels them."""
        self._stopping = True
        self._wakeup.set()
        if not self._workers:
            return
        _done, pending = await asyncio.wait(self._workers, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._workers = []
