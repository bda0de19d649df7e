"""Suite of the decode role (clauses D1.. of docs/contracts.md). Doubles: a prefill worker that
always fails (after pushing one frame with a foreign spec) and, with --kvstore-port, a KV store
that records hand-backs."""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass, field

import grpc

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc

from . import decodepush, natsclauses
from .clauses import Registry, collect_stream, expect, expect_status
from .doubles import FailingPrefill, RecordingStore, Served, add, serve
from .handback import check_handback
from .tokenstream import StreamClient, check_deltas, check_framing, first_error, rest_of, tokens_of
from .probe import Watcher, channel, expect_serving, need, same_endpoint, wait_for

REGISTRY = Registry("decode", "D")
clause = REGISTRY.clause
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PROMPT_LEN = 40   # two full blocks of 16 and a tail; ids < 256, new ones each session (so no cache is warm)


@dataclass(slots=True)
class Session:
    opts: object
    endpoint: str
    channel: grpc.aio.Channel
    stub: decode_pb2_grpc.DecodeWorkerStub
    watcher: Watcher | None
    prefill: FailingPrefill
    doubles: list[Served]
    store: RecordingStore | None
    prompt: list[int] = field(default_factory=list)
    turns: list[list[int]] = field(default_factory=list)   # prompt + output of every finished Generate
    worker_id: str = ""
    greedy: list[int] = field(default_factory=list)

    def request(self, prompt: list[int] | None = None, max_tokens: int = 8, **sampling) -> decode_pb2.GenerateRequest:
        params = common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, top_p=1.0, **sampling)
        prompt = self.prompt if prompt is None else prompt
        return decode_pb2.GenerateRequest(request_id=f"conform-{uuid.uuid4().hex[:12]}", prompt_token_ids=prompt,
                                          sampling=params, session_id="conform")

    async def generate(self, request: decode_pb2.GenerateRequest, timeout_s: float = 60) -> list[decode_pb2.GenerateResponse]:
        replies = await collect_stream(self.stub.Generate(request, timeout=timeout_s))
        self.turns.append([*request.prompt_token_ids, *tokens_of(replies)])
        return replies

    async def close(self) -> None:
        for served in self.doubles:
            await served.stop()
        if self.watcher:
            await self.watcher.close()
        await self.channel.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    chan = channel(opts.endpoint)
    prefill = FailingPrefill()
    doubles = [await serve(0, add(prefill))]
    store = None
    if opts.kvstore_port:
        store = RecordingStore()
        doubles.append(await serve(opts.kvstore_port, add(store)))
    watcher = await Watcher.start(opts.nats, "decode") if opts.nats else None
    prompt = fresh_prompt()
    return Session(opts, opts.endpoint, chan, decode_pb2_grpc.DecodeWorkerStub(chan), watcher, prefill, doubles, store,
                   prompt)


def fresh_prompt() -> list[int]:
    """PROMPT_LEN random ids in [20, 220): no two sessions (nor a session's derived prompts) share a
    block, so no cache is warm for them. (A salt of 200 values was shared by two of a module's
    ~15 sessions about a fifth of the time, and then D22's pushed blocks were already cached.)"""
    return [random.randrange(20, 220) for _ in range(PROMPT_LEN)]


@clause(1, "health: grpc.health.v1 answers SERVING for the server and kvmesh.v1.DecodeWorker")
async def health(ctx: Session) -> None:
    await expect_serving(ctx.channel, ("kvmesh.v1.DecodeWorker",))


@clause(2, "Generate stream framing: tokens in order, one final message with finish_reason and usage; max_tokens exact")
async def framing(ctx: Session) -> None:
    replies = await ctx.generate(ctx.request(max_tokens=8))
    check_framing(replies, len(ctx.prompt))
    expect(len(tokens_of(replies)) == 8 and replies[-1].finish_reason == "length",
           f"max_tokens 8 with ignore_eos gave {len(tokens_of(replies))} tokens, finish {replies[-1].finish_reason!r}")
    ctx.greedy = tokens_of(replies)


@clause(3, "greedy output is deterministic; a seeded sample repeats with the same seed")
async def deterministic(ctx: Session) -> None:
    expect(ctx.greedy, "needs D2's output")
    again = tokens_of(await ctx.generate(ctx.request(max_tokens=8)))
    expect(again == ctx.greedy, f"greedy output changed: {ctx.greedy} then {again}")
    seeded = [tokens_of(await ctx.generate(ctx.request(max_tokens=8, temperature=1.0, seed=7))) for _ in range(2)]
    expect(seeded[0] == seeded[1], f"same seed, different samples: {seeded}")


@clause(4, "stop_token_ids: the stream ends with the first stop token (included), finish_reason stop")
async def stop_token(ctx: Session) -> None:
    expect(len(ctx.greedy) >= 4, "needs D2's output")
    stop = ctx.greedy[3]
    want = ctx.greedy[: ctx.greedy.index(stop) + 1]
    replies = await ctx.generate(ctx.request(max_tokens=8, stop_token_ids=[stop]))
    check_framing(replies, len(ctx.prompt))
    expect(tokens_of(replies) == want and replies[-1].finish_reason == "stop",
           f"stop token {stop}: got {tokens_of(replies)} ({replies[-1].finish_reason!r}), expected {want} ('stop')")


@clause(5, "bad input fails INVALID_ARGUMENT: empty prompt, token id out of vocabulary, negative temperature")
async def invalid(ctx: Session) -> None:
    cases = {"an empty prompt": ctx.request(prompt=[]), "token id 2^31": ctx.request(prompt=[2**31]),
             "temperature -1": ctx.request(temperature=-1.0)}
    for what, request in cases.items():
        await expect_status(ctx.generate(request, 10), INVALID, what=f"Generate with {what}")


async def _first_then(ctx: Session, request: decode_pb2.GenerateRequest, timeout_s: float = 60):  # noqa: ANN202
    call = ctx.stub.Generate(request, timeout=timeout_s)
    first = await call.read()
    expect(first is not grpc.aio.EOF and first.token_ids, "a 2000-token generation ended before its first token")
    return call


async def _forgotten(ctx: Session, request_id: str, timeout_s: float = 5.0) -> bool:
    """True once Abort(request_id) answers found=false (the worker let go of it)."""
    for _ in range(int(timeout_s / 0.1)):
        if not (await ctx.stub.Abort(decode_pb2.AbortRequest(request_id=request_id), timeout=5)).found:
            return True
        await asyncio.sleep(0.1)
    return False


@clause(6, "Abort: found=true for a running request, whose stream then ends with finish_reason abort; found=false if unknown")
async def abort(ctx: Session) -> None:
    request = ctx.request(max_tokens=2000)
    call = await _first_then(ctx, request)
    reply = await ctx.stub.Abort(decode_pb2.AbortRequest(request_id=request.request_id), timeout=5)
    expect(reply.found, "Abort of a running request answered found=false")
    rest = await asyncio.wait_for(rest_of(call), 10)
    expect(rest and rest[-1].finish_reason == "abort", f"aborted stream ended with {rest[-1].finish_reason if rest else 'nothing'!r}")
    unknown = await ctx.stub.Abort(decode_pb2.AbortRequest(request_id=f"conform-unknown-{uuid.uuid4().hex}"), timeout=5)
    expect(not unknown.found, "Abort of an unknown request answered found=true")


@clause(7, "a client that cancels its Generate call frees the request (Abort then answers found=false)")
async def cancel(ctx: Session) -> None:
    request = ctx.request(max_tokens=2000)
    call = await _first_then(ctx, request)
    call.cancel()
    expect(await _forgotten(ctx, request.request_id), "5s after the client cancelled, the request is still running")


def _same_id(ctx: Session, request_id: str) -> decode_pb2.GenerateRequest:
    request = ctx.request(max_tokens=2)
    request.request_id = request_id
    return request


@clause(8, "a deadline that passes ends the call DEADLINE_EXCEEDED and frees the request")
async def deadline(ctx: Session) -> None:
    request = ctx.request(max_tokens=5000)
    await expect_status(ctx.generate(request, timeout_s=1.0), grpc.StatusCode.DEADLINE_EXCEEDED, what="Generate past its deadline")
    expect(await _forgotten(ctx, request.request_id), "5s after the deadline, the request is still running")


@clause(9, "a second Generate with a request_id already running fails INVALID_ARGUMENT or ALREADY_EXISTS")
async def duplicate(ctx: Session) -> None:
    request = ctx.request(max_tokens=2000)
    call = await _first_then(ctx, request)
    try:
        await expect_status(ctx.generate(_same_id(ctx, request.request_id), 10), INVALID,
                            grpc.StatusCode.ALREADY_EXISTS, what="a duplicate request_id")
    finally:
        call.cancel()


@clause(10, "remote prefill: names itself as destination, refuses a foreign-spec push, falls back and still answers the same tokens")
async def prefill_fallback(ctx: Session) -> None:
    prompt = [(t + 3) % 200 + 20 for t in ctx.prompt]
    request = ctx.request(prompt=prompt, max_tokens=6)
    request.prefill.CopyFrom(common_pb2.WorkerRef(worker_id="conform-prefill", endpoint=ctx.doubles[0].endpoint))
    request.kv_encoding = common_pb2.KV_ENCODING_INT8
    remote = await ctx.generate(request)
    check_framing(remote, len(prompt))
    local = await ctx.generate(ctx.request(prompt=prompt, max_tokens=6))
    expect(tokens_of(remote) == tokens_of(local), f"after a failed remote prefill: {tokens_of(remote)}, local: {tokens_of(local)}")
    for asked, push_error in zip(ctx.prefill.requests, ctx.prefill.push_errors):
        expect(asked.request_id == request.request_id and list(asked.prompt_token_ids) == prompt,
               "PrefillRequest does not carry the request's id and prompt")
        expect(same_endpoint(asked.destination.endpoint, ctx.endpoint), f"destination {asked.destination.endpoint} is not this worker")
        expect(asked.encoding == common_pb2.KV_ENCODING_INT8, "PrefillRequest.encoding ignores GenerateRequest.kv_encoding")
        expect(push_error in (INVALID, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION),
               f"a push with a foreign model spec was answered {push_error}")


@clause(11, "PushKv refuses a stream that does not open with KvPushOpen, or opens for no waiting request")
async def push_framing(ctx: Session) -> None:
    close = decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=0))
    await expect_status(ctx.stub.PushKv(iter([close]), timeout=10), INVALID, what="PushKv without open")
    open_ = decode_pb2.KvPushMessage(open=decode_pb2.KvPushOpen(request_id=f"conform-nobody-{uuid.uuid4().hex}",
                                                                spec=FailingPrefill.FOREIGN, num_tokens=1))
    await expect_status(ctx.stub.PushKv(iter([open_, close]), timeout=10), INVALID, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.FAILED_PRECONDITION, what="PushKv for a request nobody waits for")


@clause(12, "hand-back (optional): a finished turn is Put to the KV store two-phase, blocks hashed over prompt + output")
async def handback(ctx: Session) -> None:
    need(ctx.store, "needs --kvstore-port (a recording KV store the worker was started with)")
    need(await wait_for(lambda: ctx.store.puts, 5.0), "no hand-back Put within 5s (hand-back is optional)")
    await check_handback(ctx.store.puts, ctx.turns, ctx.opts.block_size)


@clause(13, "heartbeat: kvmesh.workers.decode.<id>.heartbeat, role DECODE, own endpoint, fields set, every <= 2 s")
async def heartbeat(ctx: Session) -> None:
    await natsclauses.check_heartbeat(ctx, "decode")


@clause(14, "heartbeat load: num_running + num_waiting counts a running request and returns to 0 after it")
async def heartbeat_load(ctx: Session) -> None:
    watcher = natsclauses.watcher_of(ctx)
    request = ctx.request(max_tokens=2000)
    call = await _first_then(ctx, request)
    mark = len(watcher.beats)

    def busy() -> bool:
        return any(b.message.num_running + b.message.num_waiting >= 1 for b in watcher.beats_of(ctx.endpoint)[mark:])

    seen = await wait_for(busy, 3.0)
    call.cancel()
    expect(seen, "no heartbeat counted the running request")
    mark = len(watcher.beats)
    idle = await wait_for(lambda: any(b.message.num_running + b.message.num_waiting == 0
                                      for b in watcher.beats_of(ctx.endpoint)[mark:]), 5.0)
    expect(idle, "heartbeats still count a cancelled request after 5s")


@clause(15, "KV events: batches numbered +1, well formed; heartbeat kv_event_seq catches up")
async def kv_events(ctx: Session) -> None:
    await natsclauses.check_kv_events(ctx)


@clause(16, "block hash agreement: announced blocks use the chained hashes of docs/contracts.md (model, dtype, block size)")
async def hash_agreement(ctx: Session) -> None:
    watcher = natsclauses.watcher_of(ctx)
    worker_id = ctx.worker_id or await watcher.worker_id(ctx.endpoint)
    announced = {h for b in watcher.batches.get(worker_id, []) for e in b.events for h in e.stored.block_hashes}
    need(announced, f"{worker_id} announced no blocks")
    model = ctx.opts.model or watcher.beats_of(ctx.endpoint)[-1].message.model
    want = BlockHasher(model, ctx.opts.dtype, ctx.opts.block_size).hashes(ctx.prompt)
    expect(want[0] in announced, f"the first block of the suite's prompt was never announced under hash {want[0].hex()[:16]} "
                                 f"(model {model!r}, dtype {ctx.opts.dtype}, block size {ctx.opts.block_size})")


@clause(17, "KV event replay: from a seen seq returns those batches or a full dump; beyond the end, none")
async def replay(ctx: Session) -> None:
    await natsclauses.check_replay(ctx)


@clause(18, "Stream: requests multiplexed on one stream each get their token ids in order, then one last delta with finish and usage; tokens equal Generate's")
async def stream_framing(ctx: Session) -> None:
    expect(ctx.greedy, "needs D2's output")
    client = StreamClient(ctx.stub)
    try:
        first, second = ctx.request(max_tokens=8), ctx.request(max_tokens=5)
        client.start(first)
        client.start(second)
        one = check_deltas(await client.finished(first.request_id), len(ctx.prompt))
        two = check_deltas(await client.finished(second.request_id), len(ctx.prompt))
        expect(one == ctx.greedy, f"greedy tokens on the Stream {one} differ from Generate's {ctx.greedy}")
        expect(two == ctx.greedy[:5], f"the second request's tokens {two} are not the first 5 greedy ones")
    finally:
        await client.close()


@clause(19, "Stream abort: an abort message ends the request with finish_reason abort; the stream stays usable")
async def stream_abort(ctx: Session) -> None:
    client = StreamClient(ctx.stub)
    try:
        long = ctx.request(max_tokens=2000)
        client.start(long)
        await client.first(long.request_id)
        client.abort(long.request_id)
        client.abort(f"conform-unknown-{uuid.uuid4().hex}")
        last = (await client.finished(long.request_id, 10.0))[-1]
        expect(last.finish_reason == "abort", f"aborted request ended {last.finish_reason!r}")
        after = ctx.request(max_tokens=2)
        client.start(after)
        check_deltas(await client.finished(after.request_id), len(ctx.prompt))
    finally:
        await client.close()


@clause(20, "Stream errors are per request: bad input or a duplicate id is one delta with error_code INVALID_ARGUMENT, and the stream goes on")
async def stream_errors(ctx: Session) -> None:
    client = StreamClient(ctx.stub)
    try:
        bad = ctx.request(prompt=[])
        running = ctx.request(max_tokens=2000)
        client.start(bad)
        client.start(running)
        await client.first(running.request_id)
        duplicate = _same_id(ctx, running.request_id)
        client.start(duplicate)
        for what, rid in (("an empty prompt", bad.request_id), ("a duplicate request id", running.request_id)):
            deltas = await client.finished(rid, 10.0) if what != "a duplicate request id" else await first_error(client, rid)
            code = deltas[-1].error_code
            expect(code == grpc.StatusCode.INVALID_ARGUMENT.value[0], f"{what}: error_code {code}, expected 3 (INVALID_ARGUMENT)")
        client.abort(running.request_id)
        ok = ctx.request(max_tokens=2)
        client.start(ok)
        check_deltas(await client.finished(ok.request_id), len(ctx.prompt))
    finally:
        await client.close()


@clause(22, "PushKv happy path: valid KV of the worker's spec for a waiting request is accepted (counts answered) "
            "and used: its full blocks serve the next Generate of the prompt from cache")
async def push_happy(ctx: Session) -> None:
    await decodepush.check_push(ctx, fresh_prompt())


@clause(21, "drain: SIGTERM → draining heartbeat, health not SERVING, the in-flight stream still finishes")
async def drain(ctx: Session) -> None:
    async def inflight() -> None:
        replies = await ctx.generate(ctx.request(max_tokens=200), timeout_s=60)
        check_framing(replies, len(ctx.prompt))
        expect(replies[-1].finish_reason == "length", f"in-flight stream ended {replies[-1].finish_reason!r} during drain")

    await natsclauses.check_drain(ctx, "decode", inflight)
