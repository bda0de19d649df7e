"""Suite of the prefill role (clauses P1.. of docs/contracts.md). Double: a decode worker that
receives and records KV pushes (it can refuse or stall them)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import grpc
import numpy as np

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import common_pb2, decode_pb2, prefill_pb2, prefill_pb2_grpc

from . import kvlayout, natsclauses
from .clauses import Registry, expect, expect_status
from .doubles import KvSink, Served, add, serve
from .probe import Watcher, channel, expect_serving

REGISTRY = Registry("prefill", "P")
clause = REGISTRY.clause
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PROMPT = [(i * 53 + 5) % 200 + 20 for i in range(40)]   # 39 tokens of KV: two full blocks of 16 and a tail of 7
CLOSE = 1e-3   # KV recomputed for the same tokens may differ by float noise, no more


@dataclass(slots=True)
class Pushed:
    """One received push: its open frame, blocks (by index) decoded to float32, the close frame."""

    open: decode_pb2.KvPushOpen
    blocks: list[common_pb2.KvBlock]
    close: decode_pb2.KvPushClose | None
    values: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class Session:
    opts: object
    endpoint: str
    channel: grpc.aio.Channel
    stub: prefill_pb2_grpc.PrefillWorkerStub
    watcher: Watcher | None
    sink: KvSink
    served: Served
    worker_id: str = ""
    raw: Pushed | None = None

    def request(self, prompt: list[int] = PROMPT, start_block: int = 0, encoding: int = kvlayout.RAW,
                destination: str | None = None) -> prefill_pb2.PrefillRequest:
        dest = self.served.endpoint if destination is None else destination
        return prefill_pb2.PrefillRequest(
            request_id=f"conform-{uuid.uuid4().hex[:12]}", prompt_token_ids=prompt, start_block=start_block,
            encoding=encoding, destination=common_pb2.WorkerRef(worker_id="conform-decode", endpoint=dest))

    async def prefill(self, request: prefill_pb2.PrefillRequest, timeout_s: float = 60) -> tuple[prefill_pb2.PrefillResponse, Pushed]:
        reply = await self.stub.Prefill(request, timeout=timeout_s)
        frames = next((p for p in self.sink.pushes if p and p[0].open.request_id == request.request_id), None)
        expect(frames is not None, f"Prefill returned OK but no push for {request.request_id} reached the destination")
        kinds = [f.WhichOneof("msg") for f in frames]
        expect(kinds[0] == "open", f"the push starts with {kinds[0]!r}, not open")
        expect(set(kinds[1:-1]) <= {"block"} and kinds[-1] == "close", f"push frames {kinds}: expected open, block..., close")
        pushed = Pushed(frames[0].open, [f.block for f in frames[1:-1]], frames[-1].close)
        return reply, pushed

    def check_push(self, request: prefill_pb2.PrefillRequest, reply: prefill_pb2.PrefillResponse, pushed: Pushed) -> None:
        """Open, block order, hashes, headers, close and the response's counts (decodes values)."""
        prompt, spec = list(request.prompt_token_ids), pushed.open.spec
        num_tokens = len(prompt) - 1
        expect(pushed.open.request_id == request.request_id, "KvPushOpen.request_id differs from the request's")
        expect(spec.model_id and spec.dtype in kvlayout.ITEMSIZE and spec.num_layers and spec.num_kv_heads and spec.head_dim,
               f"KvPushOpen.spec incomplete: {spec}")
        expect(spec.block_size == self.opts.block_size, f"spec.block_size {spec.block_size}, the mesh uses {self.opts.block_size}")
        expect((pushed.open.num_tokens, pushed.open.start_block) == (num_tokens, request.start_block),
               f"open says {pushed.open.num_tokens} tokens from block {pushed.open.start_block}, "
               f"expected {num_tokens} (prompt minus its last token) from {request.start_block}")
        bs = spec.block_size
        end = -(-num_tokens // bs)
        indices = [b.header.block_index for b in pushed.blocks]
        expect(indices == list(range(request.start_block, end)), f"block indices {indices}, expected {request.start_block}..{end - 1}")
        hashes = BlockHasher(spec.model_id, spec.dtype, bs).hashes(prompt[:num_tokens])
        for block in pushed.blocks:
            i = block.header.block_index
            want_tokens = min(bs, num_tokens - i * bs)
            expect(block.header.num_tokens == want_tokens, f"block {i} has {block.header.num_tokens} tokens, expected {want_tokens}")
            want_hash = hashes[i] if want_tokens == bs else b""
            expect(block.header.block_hash == want_hash, f"block {i}: hash is not the chained hash of its tokens"
                   if want_hash else f"block {i}: a partial block must carry no hash")
            problem = kvlayout.header_problem(block, spec, request.encoding)
            expect(not problem, problem)
            pushed.values[i] = kvlayout.decode(block, list(block.header.shape), spec.dtype)
        expect(pushed.close is not None and not pushed.close.error and pushed.close.num_blocks == len(pushed.blocks),
               f"close frame {pushed.close} does not count the {len(pushed.blocks)} blocks sent")
        nbytes = sum(len(b.data) + len(b.scales) for b in pushed.blocks)
        expect((reply.blocks_pushed, reply.bytes_pushed) == (len(pushed.blocks), nbytes),
               f"response says {reply.blocks_pushed} blocks / {reply.bytes_pushed} bytes, pushed {len(pushed.blocks)} / {nbytes}")
        expect(reply.num_computed_tokens + reply.num_cached_tokens >= num_tokens,
               f"computed {reply.num_computed_tokens} + cached {reply.num_cached_tokens} < {num_tokens} tokens")

    async def close(self) -> None:
        await self.served.stop()
        if self.watcher:
            await self.watcher.close()
        await self.channel.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    chan = channel(opts.endpoint)
    sink = KvSink()
    served = await serve(0, add(sink))
    watcher = await Watcher.start(opts.nats, "prefill") if opts.nats else None
    return Session(opts, opts.endpoint, chan, prefill_pb2_grpc.PrefillWorkerStub(chan), watcher, sink, served)


def close_to(a: np.ndarray, b: np.ndarray, slack: float) -> float:
    """Largest difference beyond float noise (0 when within `slack` + CLOSE relative)."""
    return float(np.max(np.abs(a - b) - (slack + CLOSE * np.abs(b))).clip(min=0))


@clause(1, "health: grpc.health.v1 answers SERVING for the server and kvmesh.v1.PrefillWorker")
async def health(ctx: Session) -> None:
    await expect_serving(ctx.channel, ("kvmesh.v1.PrefillWorker",))


@clause(2, "Prefill pushes the prompt's KV (all but the last token): open, blocks in order with chained hashes, close; counts agree")
async def push_raw(ctx: Session) -> None:
    request = ctx.request()
    reply, pushed = await ctx.prefill(request)
    ctx.check_push(request, reply, pushed)
    ctx.raw = pushed


@clause(3, "INT8 and INT4 pushes follow the documented layout and decode to the RAW values within one quantization step")
async def push_quantized(ctx: Session) -> None:
    expect(ctx.raw, "needs P2's push")
    for encoding in (kvlayout.INT8, kvlayout.INT4):
        request = ctx.request(encoding=encoding)
        reply, pushed = await ctx.prefill(request)
        ctx.check_push(request, reply, pushed)
        for i, values in pushed.values.items():
            raw = ctx.raw.values[i]
            off = close_to(values, raw, kvlayout.tolerance(raw, encoding))
            expect(off == 0, f"{common_pb2.KvEncoding.Name(encoding)} block {i} is {off:.4f} beyond a quantization step from RAW")


@clause(4, "start_block: blocks the destination holds are not pushed; the rest equal a full push's")
async def start_block(ctx: Session) -> None:
    expect(ctx.raw, "needs P2's push")
    request = ctx.request(start_block=1)
    reply, pushed = await ctx.prefill(request)
    ctx.check_push(request, reply, pushed)
    for i, values in pushed.values.items():
        expect(close_to(values, ctx.raw.values[i], 0) == 0, f"block {i} differs from the full push's block {i}")


@clause(5, "causality: a block's KV depends only on the tokens up to it (a longer prompt, same first blocks)")
async def causal(ctx: Session) -> None:
    expect(ctx.raw, "needs P2's push")
    request = ctx.request(prompt=PROMPT + [21, 22, 23, 24, 25, 26, 27, 28, 29, 30])
    reply, pushed = await ctx.prefill(request)
    ctx.check_push(request, reply, pushed)
    for i in (0, 1):
        expect(close_to(pushed.values[i], ctx.raw.values[i], 0) == 0, f"block {i} changed when later tokens were added")


@clause(6, "a destination that refuses the push makes Prefill fail with a non-OK status (not OK, not UNKNOWN)")
async def refused(ctx: Session) -> None:
    ctx.sink.refuse = "conform: refused"
    try:
        try:
            await ctx.stub.Prefill(ctx.request(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            expect(exc.code() not in (grpc.StatusCode.UNKNOWN,), f"refused push surfaced as {exc.code().name}")
        else:
            expect(False, "Prefill answered OK although the destination refused every block")
    finally:
        ctx.sink.refuse = ""


@clause(7, "an unreachable destination makes Prefill fail UNAVAILABLE (or DEADLINE_EXCEEDED), not hang")
async def unreachable(ctx: Session) -> None:
    request = ctx.request(destination="127.0.0.1:1")
    await expect_status(ctx.stub.Prefill(request, timeout=30), grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED, what="Prefill to 127.0.0.1:1")


@clause(8, "bad input fails INVALID_ARGUMENT: empty prompt, no destination, start_block past the prompt, token id out of vocabulary")
async def invalid(ctx: Session) -> None:
    cases = {"an empty prompt": ctx.request(prompt=[]), "no destination": ctx.request(destination=""),
             "start_block 99": ctx.request(start_block=99), "token id 2^31": ctx.request(prompt=[2**31, 5, 6])}
    for what, request in cases.items():
        await expect_status(ctx.stub.Prefill(request, timeout=30), INVALID, what=f"Prefill with {what}")


@clause(9, "a caller's deadline ends Prefill DEADLINE_EXCEEDED; the worker keeps serving")
async def deadline(ctx: Session) -> None:
    ctx.sink.stall_s = 3.0
    try:
        await expect_status(ctx.stub.Prefill(ctx.request(), timeout=1.0), grpc.StatusCode.DEADLINE_EXCEEDED,
                            what="Prefill while the destination stalls")
    finally:
        ctx.sink.stall_s = 0.0
    request = ctx.request()
    reply, pushed = await ctx.prefill(request)
    ctx.check_push(request, reply, pushed)


@clause(10, "heartbeat: kvmesh.workers.prefill.<id>.heartbeat, role PREFILL, own endpoint, fields set, every <= 2 s")
async def heartbeat(ctx: Session) -> None:
    await natsclauses.check_heartbeat(ctx, "prefill")


@clause(11, "KV events: batches numbered +1, well formed; heartbeat kv_event_seq catches up")
async def kv_events(ctx: Session) -> None:
    await natsclauses.check_kv_events(ctx)


@clause(12, "KV event replay: from a seen seq returns those batches or a full dump; beyond the end, none")
async def replay(ctx: Session) -> None:
    await natsclauses.check_replay(ctx)


@clause(13, "drain: SIGTERM → draining heartbeat, health not SERVING")
async def drain(ctx: Session) -> None:
    await natsclauses.check_drain(ctx, "prefill")
