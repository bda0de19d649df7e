"""Scheduler suite, admission clauses (S17, S18 of docs/contracts.md): the suite leaves one
decode worker of `max_num_seqs = 1` live, fills the mesh-wide admission limit and queue with
Routes it does not Complete, and checks refusal, release, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc

from kvmesh.runtime.pb import scheduler_pb2

from .clauses import ClauseFailed, expect, expect_status
from .scheduler import DECODE, EXPIRY_S, Session, clause

MAX_OUTSTANDING = 32   # contracts.md S17: with one max_num_seqs = 1 mesh-wide, refused by this many Routes
QUEUED_AFTER_S = 0.3   # a Route not answered this long is taken as queued
EXHAUSTED, DEADLINE = grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED


class Admission:
    """The suite's view of the scheduler's admission: Routes it holds (admitted, not Completed)
    and Routes still waiting in the queue."""

    def __init__(self, ctx: Session) -> None:
        self.ctx = ctx
        self.held: list[str] = []
        self.queued: dict[str, asyncio.Task] = {}

    def call(self, request_id: str, timeout_s: float) -> grpc.aio.UnaryUnaryCall:
        return self.ctx.stub.Route(scheduler_pb2.RouteRequest(
            request_id=request_id, num_prompt_tokens=8, max_tokens=16, pool=self.ctx.pool, model=self.ctx.opts.model,
        ), timeout=timeout_s)

    async def offer(self, wait_s: float = QUEUED_AFTER_S) -> grpc.aio.AioRpcError | None:
        """One more Route: admitted (held), queued (no answer within `wait_s`), or refused (the
        error is returned)."""
        request_id = f"conform-adm-{uuid.uuid4().hex[:10]}"
        task = asyncio.ensure_future(self.call(request_id, 30.0))
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done:
            self.queued[request_id] = task
            return None
        try:
            task.result()
        except grpc.aio.AioRpcError as exc:
            return exc
        self.held.append(request_id)
        return None

    def settle(self) -> grpc.aio.AioRpcError | None:
        """Queued Routes that have answered since (a slow admission) move to held; returns an error one got."""
        for request_id, task in list(self.queued.items()):
            if task.done():
                del self.queued[request_id]
                if isinstance(task.exception(), grpc.aio.AioRpcError):
                    return task.exception()
                self.held.append(request_id)
        return None

    async def fill(self) -> grpc.aio.AioRpcError:
        """Routes until one is refused; fails the clause when none is within MAX_OUTSTANDING."""
        for _ in range(MAX_OUTSTANDING):
            if (refused := await self.offer() or self.settle()) is not None:
                return refused
        raise ClauseFailed(f"{MAX_OUTSTANDING} outstanding Routes with one decode worker of max_num_seqs 1: never "
                           f"refused ({len(self.held)} admitted, {len(self.queued)} queued)")

    async def complete(self, request_id: str) -> None:
        await self.ctx.stub.Complete(scheduler_pb2.CompleteRequest(request_id=request_id, status="ok"), timeout=10)

    async def release_all(self) -> None:
        for task in self.queued.values():
            task.cancel()
        for request_id in [*self.held, *self.queued]:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.complete(request_id)
        self.held.clear()
        self.queued.clear()


async def only_one_slot(ctx: Session) -> None:
    """Every decode worker the suite played so far drains; one with max_num_seqs = 1 is left."""
    for name, w in ctx.workers.items():
        if name != "a1" and w.role == DECODE and w.running:
            w.draining = True
            await w.beat()
    a1 = await ctx.worker("a1", max_num_seqs=1)

    async def alone() -> bool:
        live = [w.worker_id for w in (await ctx.listed()).values() if w.role == DECODE and not w.draining]
        return live == [a1.worker_id]

    deadline = time.monotonic() + EXPIRY_S   # workers of earlier sessions expire within this (S15)
    while time.monotonic() < deadline and not await alone():
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)  # admission capacity follows the registry within a sweep


@clause(17, f"admission: with one max_num_seqs=1 worker, Routes are refused RESOURCE_EXHAUSTED with a retry-after "
            f"trailer within {MAX_OUTSTANDING}; Complete frees the slot for a queued Route")
async def admission_full(ctx: Session) -> None:
    await only_one_slot(ctx)
    adm = Admission(ctx)
    try:
        refused = await adm.fill()
        expect(refused.code() == EXHAUSTED,
               f"a Route beyond the limit failed {refused.code().name} ({refused.details()})")
        trailers = dict(refused.trailing_metadata() or ())
        try:
            retry_after = float(trailers.get("retry-after", ""))
        except ValueError:
            retry_after = -1.0
        expect(retry_after > 0, f"RESOURCE_EXHAUSTED without a positive retry-after trailer (trailers {trailers})")
        expect(adm.held, "no Route was admitted at all")
        if adm.queued:
            for request_id in list(adm.held):
                await adm.complete(request_id)
                adm.held.remove(request_id)
            first_id, first = next(iter(adm.queued.items()))
            done, _ = await asyncio.wait({first}, timeout=3.0)
            expect(done, "Complete of every admitted Route did not admit the oldest queued one within 3 s")
            first.result()
            adm.held.append(first_id)
            del adm.queued[first_id]
        await adm.release_all()
        expect(await adm.offer(wait_s=3.0) is None and adm.held,
               "with every Route Completed, a new Route is not admitted at once (Complete did not free the slot)")
    finally:
        await adm.release_all()


@clause(18, "admission: a Route whose deadline passes (or whose caller cancels) while queued ends DEADLINE_EXCEEDED "
            "(or cancelled) and leaves no admission entry behind")
async def admission_deadline(ctx: Session) -> None:
    await only_one_slot(ctx)
    adm = Admission(ctx)
    try:
        expect(await adm.offer(wait_s=3.0) is None and adm.held,
               "the first Route on an idle admission was not admitted within 3 s")
        await expect_status(adm.call(f"conform-late-{uuid.uuid4().hex[:10]}", 0.5), DEADLINE,
                            what="a Route queued past its 0.5 s deadline")
        cancelled = asyncio.ensure_future(adm.call(f"conform-cancel-{uuid.uuid4().hex[:10]}", 30.0))
        done, _ = await asyncio.wait({cancelled}, timeout=QUEUED_AFTER_S)
        if done:
            outcome = cancelled.exception()
            expect(False, f"a Route offered behind the timed-out one answered at once "
                          f"({outcome.code().name if outcome else 'admitted'}): "
                          "the timed-out Route still holds its place")
        cancelled.cancel()
        await asyncio.sleep(0.3)
        await adm.release_all()
        expect(await adm.offer(wait_s=3.0) is None and adm.held,
               "after the holder Completed, a new Route is not admitted at once: the timed-out or cancelled Route "
               "still holds the queue or the slot")
    finally:
        await adm.release_all()
