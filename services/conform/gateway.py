"""Suite of the gateway role (clauses G1.. of docs/contracts.md). The gateway under test must be
started with `--scheduler 127.0.0.1:<--scheduler-port>`: there the suite runs a fake scheduler
that routes to two fake decode workers echoing the prompt back."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import grpc
import httpx

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.bus import MIRROR_SUBJECT, Bus
from kvmesh.runtime.pb import events_pb2

from . import gatewaydoubles
from .clauses import Registry, expect
from .probe import need, wait_for

REGISTRY = Registry("gateway", "G")
clause = REGISTRY.clause
TEXT = "Conformance suites keep swapped services honest, one clause at a time."


@dataclass(slots=True)
class Session:
    opts: object
    http: httpx.AsyncClient
    doubles: gatewaydoubles.Doubles
    bus: Bus | None
    model: str = ""
    mirrored: list[events_pb2.MirrorRecord] = field(default_factory=list)

    async def completion(self, body: dict, headers: dict | None = None, text: str = TEXT) -> httpx.Response:
        self.doubles.text = text
        return await self.http.post("/v1/completions", json={"model": self.model, **body}, headers=headers or {})

    async def sse(self, path: str, body: dict, text: str = TEXT) -> list[str]:
        """The `data:` payloads of a streamed response, in order."""
        self.doubles.text = text
        events = []
        async with self.http.stream("POST", path, json={"model": self.model, "stream": True, **body}) as reply:
            expect(reply.status_code == 200, f"stream answered {reply.status_code}")
            expect(reply.headers.get("content-type", "").startswith("text/event-stream"),
                   f"content-type {reply.headers.get('content-type')!r}, expected text/event-stream")
            async for line in reply.aiter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
        return events

    def last_route(self):  # noqa: ANN201
        expect(self.doubles.scheduler.routes, "the gateway never called Scheduler.Route")
        return self.doubles.scheduler.routes[-1]

    def generates(self, request_id: str) -> list:
        return [c for d in self.doubles.decodes.values() for c in d.generates if c.request.request_id == request_id]

    async def close(self) -> None:
        await self.http.aclose()
        await self.doubles.close()
        if self.bus:
            await self.bus.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    need(opts.scheduler_port, "needs --scheduler-port (start the gateway with --scheduler 127.0.0.1:PORT)")
    doubles = await gatewaydoubles.start(opts.scheduler_port)
    http = httpx.AsyncClient(base_url=opts.endpoint.rstrip("/"), timeout=30)
    bus = await Bus.connect(opts.nats, "conform-gateway") if opts.nats else None
    ctx = Session(opts, http, doubles, bus, opts.model)
    if bus:
        async def on_record(record: events_pb2.MirrorRecord, _msg) -> None:  # noqa: ANN001
            ctx.mirrored.append(record)

        await bus.subscribe(MIRROR_SUBJECT, events_pb2.MirrorRecord, on_record)
    return ctx


def openai_error(reply: httpx.Response, status: int, what: str) -> None:
    expect(reply.status_code == status, f"{what}: HTTP {reply.status_code}, expected {status}")
    try:
        error = reply.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    expect(isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("type"),
           f"{what}: body is not OpenAI error JSON: {reply.text[:200]}")


@clause(1, "GET /health answers 200 while the scheduler is SERVING and lists a live decode worker in its pool")
async def health(ctx: Session) -> None:
    status = None
    for _ in range(300):  # NOTE: the gateway may still be starting (it was started beside the suite)
        try:
            status = (await ctx.http.get("/health")).status_code
        except httpx.TransportError:
            status = None
        if status == 200:
            return
        await asyncio.sleep(0.2)
    expect(False, f"GET /health answered {status or 'nothing'} for 60s")


@clause(2, "GET /v1/models lists the served model")
async def models(ctx: Session) -> None:
    reply = await ctx.http.get("/v1/models")
    expect(reply.status_code == 200, f"/v1/models answered {reply.status_code}")
    data = reply.json().get("data") or []
    expect(data and all(m.get("id") and m.get("object") == "model" for m in data), f"no models listed: {reply.text[:200]}")
    ctx.model = ctx.model or data[0]["id"]


@clause(3, "a completion is one Route and one Generate under one gateway-made request id, then Complete(ok); text and usage come from the worker")
async def completion(ctx: Session) -> None:
    reply = await ctx.completion({"prompt": TEXT, "max_tokens": 64, "temperature": 0})
    expect(reply.status_code == 200, f"completion answered {reply.status_code}: {reply.text[:200]}")
    body = reply.json()
    route = ctx.last_route().request
    gens = ctx.generates(route.request_id)
    expect(route.request_id and len(gens) == 1, f"Route {route.request_id!r} was followed by {len(gens)} Generate calls")
    gen = gens[0].request
    expect(route.num_prompt_tokens == len(gen.prompt_token_ids), "Route.num_prompt_tokens differs from the prompt sent")
    expect(gen.sampling.max_tokens == 64 and gen.sampling.temperature == 0, f"sampling not passed on: {gen.sampling}")
    expect(body["choices"][0]["text"] == TEXT, f"text {body['choices'][0]['text']!r}, the worker sent {TEXT!r}")
    usage, ids = body.get("usage") or {}, len(gen.prompt_token_ids)
    expect((usage.get("prompt_tokens"), usage.get("completion_tokens")) == (ids, ids), f"usage {usage}, worker said {ids}/{ids}")
    done = await wait_for(lambda: any(c.request_id == route.request_id for c in ctx.doubles.scheduler.completes), 3.0)
    expect(done, "no Scheduler.Complete for the finished request")
    status = next(c.status for c in ctx.doubles.scheduler.completes if c.request_id == route.request_id)
    expect(status == "ok", f"Complete status {status!r} for a finished request")


@clause(4, "every Route call carries a deadline, and so does every Generate call (the Stream lives like a connection)")
async def deadlines(ctx: Session) -> None:
    route = ctx.last_route()
    expect(route.deadline_s is not None, "Route had no deadline")
    gens = ctx.generates(route.request.request_id)
    expect(gens, "no Generate for the request (neither a Generate call nor a Stream generate)")
    expect(all(g.deadline_s is not None for g in gens if not g.via_stream), "Generate had no deadline")


@clause(5, "block hash agreement: Route.block_hashes are the chained hashes of the prompt (docs/contracts.md)")
async def block_hashes(ctx: Session) -> None:
    reply = await ctx.completion({"prompt": TEXT * 2, "max_tokens": 200}, text=TEXT * 2)
    expect(reply.status_code == 200, f"completion answered {reply.status_code}")
    route = ctx.last_route().request
    prompt = list(ctx.generates(route.request_id)[0].request.prompt_token_ids)
    want = BlockHasher(ctx.model, ctx.opts.dtype, ctx.opts.block_size).hashes(prompt)
    expect(len(want) >= 2, "the prompt is shorter than two blocks")
    expect(list(route.block_hashes) == want, f"{len(route.block_hashes)} hashes sent, {len(want)} expected; "
           f"first {route.block_hashes[0].hex()[:16] if route.block_hashes else '-'} vs {want[0].hex()[:16]}")


@clause(6, "SSE stream: data: chunks with one id, the text in order, one finish_reason, a usage chunk, then [DONE]")
async def stream(ctx: Session) -> None:
    events = await ctx.sse("/v1/completions", {"prompt": TEXT, "max_tokens": 64, "stream_options": {"include_usage": True}})
    expect(events and events[-1] == "[DONE]", f"stream does not end with data: [DONE] (last: {events[-1:]})")
    chunks = [json.loads(e) for e in events[:-1]]
    expect(len({c["id"] for c in chunks}) == 1, "chunks carry different ids")
    text = "".join(ch.get("text", "") for c in chunks for ch in c["choices"])
    expect(text == TEXT, f"streamed text {text!r}, the worker sent {TEXT!r}")
    finishes = [i for i, c in enumerate(chunks) for ch in c["choices"] if ch.get("finish_reason")]
    expect(len(finishes) == 1, f"{len(finishes)} chunks carry a finish_reason")
    usage = [i for i, c in enumerate(chunks) if c.get("usage")]
    expect(usage and usage[-1] == len(chunks) - 1 and finishes[0] < usage[-1] and not chunks[-1]["choices"],
           "include_usage: the last chunk before [DONE] must carry usage and no choices")


@clause(7, "chat SSE stream: the first delta names the assistant role; one finish_reason; [DONE] last")
async def chat_stream(ctx: Session) -> None:
    events = await ctx.sse("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}], "max_tokens": 200})
    expect(events and events[-1] == "[DONE]", "chat stream does not end with data: [DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    expect(chunks and chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first delta has no role assistant")
    expect(all(c["object"] == "chat.completion.chunk" for c in chunks), "chunks are not chat.completion.chunk objects")
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    expect(len(finishes) == 1, f"{len(finishes)} chunks carry a finish_reason")


@clause(8, "bad input is HTTP 400 with OpenAI error JSON, and no Route is made")
async def bad_input(ctx: Session) -> None:
    before = len(ctx.doubles.scheduler.routes)
    reply = await ctx.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    openai_error(reply, 400, "a body that is not JSON")
    openai_error(await ctx.completion({"prompt": TEXT, "max_tokens": -1}), 400, "max_tokens -1")
    openai_error(await ctx.completion({"prompt": TEXT, "temperature": "hot"}), 400, "temperature 'hot'")
    expect(len(ctx.doubles.scheduler.routes) == before, "a refused request was routed anyway")


@clause(9, "Route RESOURCE_EXHAUSTED (retry-after trailer) is HTTP 429 with Retry-After; UNAVAILABLE is 503; both OpenAI error JSON")
async def overload(ctx: Session) -> None:
    try:
        ctx.doubles.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = await ctx.completion({"prompt": TEXT, "max_tokens": 8})
        openai_error(reply, 429, "scheduler RESOURCE_EXHAUSTED")
        expect(reply.headers.get("retry-after") == "3", f"Retry-After {reply.headers.get('retry-after')!r}, scheduler said 3")
        ctx.doubles.refuse = grpc.StatusCode.UNAVAILABLE
        openai_error(await ctx.completion({"prompt": TEXT, "max_tokens": 8}), 503, "scheduler UNAVAILABLE")
    finally:
        ctx.doubles.refuse = None


@clause(10, "a decode worker failing mid-stream: re-Route excluding it, Generate elsewhere with the streamed tokens appended; the client sees each token once")
async def migration(ctx: Session) -> None:
    first = next(iter(ctx.doubles.decodes))
    ctx.doubles.fail_after[first] = 2
    events = await ctx.sse("/v1/completions", {"prompt": TEXT, "max_tokens": 200})
    ctx.doubles.fail_after.clear()
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    errors = [c["error"] for c in chunks if "error" in c]
    expect(not errors, f"the stream ended with an error instead of moving to another worker: {errors[:1]}")
    text = "".join(ch.get("text", "") for c in chunks for ch in c["choices"])
    routes = [r.request for r in ctx.doubles.scheduler.routes[-2:]]
    expect(len({r.request_id for r in routes}) == 1, "the re-Route does not carry the request's id")
    expect(first in routes[1].exclude_workers, f"re-Route excludes {list(routes[1].exclude_workers)}, not the failed {first}")
    gens = ctx.generates(routes[0].request_id)
    expect(len(gens) == 2, f"{len(gens)} Generate calls, expected 2")
    original, moved = list(gens[0].request.prompt_token_ids), list(gens[1].request.prompt_token_ids)
    streamed = original[: 2 * gatewaydoubles.PER_MESSAGE]
    expect(moved == original + streamed, "the migrated prompt is not the prompt + the tokens already streamed")
    expect(gens[1].request.sampling.max_tokens == 200 - len(streamed), "max_tokens not reduced by the tokens streamed")
    expect(text == TEXT, f"client saw {text!r}, expected {TEXT!r} (tokens lost or repeated)")


@clause(11, "a client that disconnects: the Generate call is cancelled (or Abort sent) and Complete reports a non-ok status")
async def disconnect(ctx: Session) -> None:
    ctx.doubles.slow, ctx.doubles.text = True, TEXT
    try:
        async with ctx.http.stream("POST", "/v1/completions", json={"model": ctx.model, "prompt": TEXT, "stream": True,
                                                                     "max_tokens": 1000}) as reply:
            expect(reply.status_code == 200, f"stream answered {reply.status_code}")
            async for line in reply.aiter_lines():
                if line.startswith("data:"):
                    break
        request_id = ctx.last_route().request.request_id
        call = ctx.generates(request_id)[-1]
        gone = await wait_for(lambda: call.cancelled.is_set() or any(
            request_id == a for d in ctx.doubles.decodes.values() for a in d.aborts), 5.0)
        expect(gone, "5s after the client left, the Generate call is neither cancelled nor aborted")
        completed = await wait_for(lambda: any(c.request_id == request_id for c in ctx.doubles.scheduler.completes), 5.0)
        expect(completed, "no Scheduler.Complete after the client left")
        status = next(c.status for c in ctx.doubles.scheduler.completes if c.request_id == request_id)
        expect(status != "ok", "Complete says ok for a request the client abandoned")
    finally:
        ctx.doubles.slow = False


@clause(12, "request ids: X-Request-Id is echoed but never the mesh's key (two requests with one X-Request-Id get two ids)")
async def request_ids(ctx: Session) -> None:
    mine = f"conform-{uuid.uuid4().hex[:8]}"
    seen = []
    for _ in range(2):
        reply = await ctx.completion({"prompt": TEXT, "max_tokens": 8}, headers={"X-Request-Id": mine})
        expect(reply.headers.get("x-request-id") == mine, f"X-Request-Id not echoed ({reply.headers.get('x-request-id')!r})")
        seen.append(ctx.last_route().request.request_id)
    expect(seen[0] != seen[1] and mine not in seen, f"mesh request ids {seen} for the client id {mine!r}")


@clause(13, "X-Session-Id reaches Route.session_id and Generate.session_id")
async def session_id(ctx: Session) -> None:
    await ctx.completion({"prompt": TEXT, "max_tokens": 8}, headers={"X-Session-Id": "conform-session"})
    route = ctx.last_route().request
    expect(route.session_id == "conform-session", f"Route.session_id {route.session_id!r}")
    gen = ctx.generates(route.request_id)[-1].request
    expect(gen.session_id == "conform-session", f"Generate.session_id {gen.session_id!r}")


@clause(14, "mirror (when on): a MirrorRecord on kvmesh.mirror.requests carries the request id, prompt and output tokens")
async def mirror(ctx: Session) -> None:
    need(ctx.bus, "needs --nats")
    await ctx.completion({"prompt": TEXT, "max_tokens": 64})
    route = ctx.last_route().request
    found = await wait_for(lambda: any(r.request_id == route.request_id for r in ctx.mirrored), 3.0)
    need(found, "no MirrorRecord within 3s (mirroring is off: gateway.mirror_sample=0)")
    record = next(r for r in ctx.mirrored if r.request_id == route.request_id)
    prompt = list(ctx.generates(route.request_id)[-1].request.prompt_token_ids)
    expect(list(record.prompt_token_ids) == prompt, "MirrorRecord.prompt_token_ids differ from the prompt sent")
    expect(list(record.output_token_ids) == prompt, "MirrorRecord.output_token_ids differ from what the worker streamed")
    expect(record.finish_reason == "length" and record.model == ctx.model, f"finish {record.finish_reason!r}, model {record.model!r}")
