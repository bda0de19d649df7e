"""Scheduler suite, the Routes stream (S19 of docs/contracts.md): routes and completes of many
requests multiplexed on one `Scheduler.Routes` call, driven over real gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc

from kvmesh.runtime.pb import scheduler_pb2

from .clauses import expect
from .scheduler import DECODE, Session, clause

ROUTES = 8          # routes in flight on the stream at once
ANSWER_S = 10.0     # each read waits at most this long
RELEASED_S = 3.0    # a complete frees the request's load within this

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def routed(request: scheduler_pb2.RouteRequest) -> scheduler_pb2.RouteStreamRequest:
    return scheduler_pb2.RouteStreamRequest(route=scheduler_pb2.StreamedRoute(request=request, timeout_s=ANSWER_S))


def completed(request_id: str) -> scheduler_pb2.RouteStreamRequest:
    return scheduler_pb2.RouteStreamRequest(complete=scheduler_pb2.CompleteRequest(request_id=request_id, status="ok"))


async def read(call: grpc.aio.StreamStreamCall, what: str) -> scheduler_pb2.RouteStreamResponse:
    try:
        out = await asyncio.wait_for(call.read(), ANSWER_S)
    except TimeoutError:
        out = None
    expect(out is not None, f"no answer within {ANSWER_S:g} s while waiting for {what}")
    if out is grpc.aio.EOF:
        expect(False, f"the stream ended ({(await call.code()).name}) while waiting for {what}")
    return out


@clause(19, "Routes stream: each route answered once under its id as Route would; a bad one is error_code 3 and the "
            "stream goes on; complete frees the request like Complete and is not answered; a half-close ends it OK")
async def routes_stream(ctx: Session) -> None:
    s1, s2 = await ctx.worker("s1"), await ctx.worker("s2")
    both = await _until_listed(ctx, s1.worker_id, s2.worker_id)
    expect(both, f"{s1.worker_id} and {s2.worker_id} not both in ListWorkers within 3 s of their heartbeats")
    pool = [w.worker_id for w in (await ctx.listed()).values() if w.role == DECODE and w.pool == ctx.pool]
    tag = uuid.uuid4().hex[:8]
    call = ctx.stub.Routes(timeout=60)
    try:
        want: dict[str, str] = {}
        for i in range(ROUTES):
            keep = (s1, s2)[i % 2].worker_id
            request_id = f"conform-st-{tag}-{i}"
            want[request_id] = keep
            await call.write(routed(scheduler_pb2.RouteRequest(
                request_id=request_id, num_prompt_tokens=8, max_tokens=16, pool=ctx.pool,
                exclude_workers=[w for w in pool if w != keep], model=ctx.opts.model)))
        bad_id = f"conform-st-{tag}-bad"
        await call.write(routed(scheduler_pb2.RouteRequest(request_id=bad_id, pool=ctx.pool)))  # no prompt tokens
        got: dict[str, scheduler_pb2.RouteStreamResponse] = {}
        while len(got) < ROUTES + 1:
            out = await read(call, f"{ROUTES + 1 - len(got)} more answers")
            expect(out.request_id in want or out.request_id == bad_id, f"an answer for an id never routed: {out.request_id!r}")
            expect(out.request_id not in got, f"{out.request_id} answered twice")
            got[out.request_id] = out
        bad = got.pop(bad_id)
        expect(bad.error_code == INVALID_ARGUMENT and not bad.HasField("route"),
               f"a route with num_prompt_tokens 0 answered error_code {bad.error_code} ({bad.error_message!r}), expected 3")
        for request_id, out in got.items():
            expect(out.error_code == 0, f"{request_id} failed: error_code {out.error_code} ({out.error_message})")
            expect(out.route.decode.worker_id == want[request_id],
                   f"{request_id} answered {out.route.decode.worker_id}, the only worker it did not exclude is {want[request_id]}")
            expect(out.route.pool == ctx.pool, f"{request_id} answered pool {out.route.pool!r}, asked {ctx.pool!r}")
        listed = await ctx.listed()
        held = sum(listed[w].inflight for w in (s1.worker_id, s2.worker_id) if w in listed)
        expect(held >= ROUTES, f"{ROUTES} routed requests not completed, yet ListWorkers counts {held} in flight")
        for request_id in want:
            await call.write(completed(request_id))
        last = f"conform-st-{tag}-last"
        await call.write(routed(scheduler_pb2.RouteRequest(request_id=last, num_prompt_tokens=8, pool=ctx.pool,
                                                           model=ctx.opts.model)))
        out = await read(call, "the answer of a route sent after the completes")
        expect(out.request_id == last, f"after {ROUTES} completes the next message is for {out.request_id!r}, not the "
                                       "route sent after them (a complete must not be answered)")
        await call.write(completed(last))
        freed = await _until_idle(ctx, s1.worker_id, s2.worker_id)
        expect(freed, f"load still counted on {s1.worker_id}/{s2.worker_id} {RELEASED_S:g} s after every request's complete")
        await call.done_writing()
        rest = await read_to_end(call)
        expect(rest == [], f"after the half-close the stream sent {len(rest)} more message(s)")
        code = await call.code()
        expect(code is grpc.StatusCode.OK, f"after the client's half-close the stream ended {code.name}, not OK")
    finally:
        call.cancel()


async def read_to_end(call: grpc.aio.StreamStreamCall) -> list:
    rest = []
    with contextlib.suppress(TimeoutError):
        while (out := await asyncio.wait_for(call.read(), ANSWER_S)) is not grpc.aio.EOF:
            rest.append(out)
    return rest


async def _until_listed(ctx: Session, *worker_ids: str) -> bool:
    deadline = time.monotonic() + 3.0
    while not set(worker_ids) <= set(await ctx.listed()):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def _until_idle(ctx: Session, *worker_ids: str) -> bool:
    deadline = time.monotonic() + RELEASED_S
    while True:
        listed = await ctx.listed()
        if all(listed[w].inflight == 0 for w in worker_ids if w in listed):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
