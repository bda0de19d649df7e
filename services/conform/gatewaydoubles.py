"""The gateway suite's doubles: a scheduler and two decode workers that echo a known text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from kvmesh.runtime.pb import common_pb2, decode_pb2, scheduler_pb2

from .doubles import Call, FakeDecode, FakeScheduler, Served, add, echo_replies, serve

PER_MESSAGE = 2   # token ids per Generate message


def echo_stream(ids: list[int], text: str, already: int) -> list[decode_pb2.GenerateResponse]:
    """The echo of `ids` (whose text is `text`) from token `already` on: a migrated request
    carries the tokens streamed before in its prompt."""
    full = echo_replies(ids, text, 0, PER_MESSAGE)
    rest = full[already // PER_MESSAGE :]
    rest[-1].usage.prompt_tokens = len(ids) + already
    rest[-1].usage.completion_tokens = len(ids) - already
    return rest


@dataclass(slots=True)
class Doubles:
    scheduler: FakeScheduler
    decodes: dict[str, FakeDecode]
    served: list[Served]
    text: str = ""                                             # the text of the prompt the suite sends next
    first_prompt: dict[str, list[int]] = field(default_factory=dict)   # request id -> prompt of its first Generate
    fail_after: dict[str, int] = field(default_factory=dict)   # worker -> messages before UNAVAILABLE
    slow: bool = False                                        # stream forever, one message per 0.1 s
    refuse: grpc.StatusCode | None = None                     # Route fails with this status

    def ref(self, name: str) -> common_pb2.WorkerRef:
        return common_pb2.WorkerRef(worker_id=name, endpoint=self.served[1 + list(self.decodes).index(name)].endpoint)

    async def close(self) -> None:
        for served in self.served:
            await served.stop()


async def start(scheduler_port: int) -> Doubles:
    scheduler = FakeScheduler()
    doubles = Doubles(scheduler, {}, [])

    async def route(request: scheduler_pb2.RouteRequest, context: grpc.aio.ServicerContext) -> scheduler_pb2.RouteResponse:
        if doubles.refuse is not None:
            if doubles.refuse is grpc.StatusCode.RESOURCE_EXHAUSTED:
                context.set_trailing_metadata((("retry-after", "3"),))
            await context.abort(doubles.refuse, "conform: scripted refusal")
        name = next(n for n in doubles.decodes if n not in request.exclude_workers) if len(
            set(doubles.decodes) - set(request.exclude_workers)) else None
        if name is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "conform: every worker excluded")
        return scheduler_pb2.RouteResponse(decode=doubles.ref(name), local_prefill=True, policy="conform",
                                           pool=request.pool or "production")

    def script_for(name: str):  # noqa: ANN202
        async def generate(request: decode_pb2.GenerateRequest, context, call: Call) -> AsyncIterator[decode_pb2.GenerateResponse]:  # noqa: ANN001
            if doubles.slow:
                for i in range(1000):
                    await asyncio.sleep(0.1)
                    yield decode_pb2.GenerateResponse(token_ids=request.prompt_token_ids[-1:], text=doubles.text[:1])
                return
            ids = doubles.first_prompt.setdefault(request.request_id, list(request.prompt_token_ids))
            already = len(request.prompt_token_ids) - len(ids)
            for i, reply in enumerate(echo_stream(ids, doubles.text, already)):
                if doubles.fail_after.get(name) == i:
                    doubles.fail_after.pop(name)
                    raise grpc.aio.AbortError  # Generate: the call fails; Stream: the whole stream fails
                yield reply
        return generate

    scheduler.script = route
    doubles.served.append(await serve(scheduler_port, add(scheduler)))
    for name in ("conform-decode-a", "conform-decode-b"):
        doubles.decodes[name] = FakeDecode(name, script_for(name))
        doubles.served.append(await serve(0, add(doubles.decodes[name])))
    return doubles
