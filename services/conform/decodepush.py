"""Decode suite, PushKv happy path (clause D22 of docs/contracts.md): a prefill double that
pushes valid KV (random values, the worker's own ModelSpec, the layout of contracts.md) to the
destination the worker names, and the clause that checks the push is taken and its blocks used."""

from __future__ import annotations

import grpc
import numpy as np

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc

from . import kvlayout
from .clauses import expect
from .doubles import add, serve
from .probe import channel, need, wait_for
from .tokenstream import check_framing


class PushingPrefill(prefill_pb2_grpc.PrefillWorkerServicer):
    """A prefill double that answers each Prefill by pushing `spec`-shaped random KV of the prompt
    minus its last token (blocks from `start_block`, full ones with their chained hash) to the
    destination, in RAW for a float32 spec and INT8 otherwise."""

    def __init__(self, spec: common_pb2.ModelSpec, seed: int = 0) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.requests: list[prefill_pb2.PrefillRequest] = []
        self.sent: list[tuple[int, int]] = []                      # (blocks, bytes) per push
        self.replies: list[decode_pb2.PushKvResponse | None] = []
        self.errors: list[str] = []

    def frames(self, request: prefill_pb2.PrefillRequest) -> list[decode_pb2.KvPushMessage]:
        spec, bs = self.spec, self.spec.block_size
        prompt = list(request.prompt_token_ids)
        num_tokens = len(prompt) - 1
        hashes = BlockHasher(spec.model_id, spec.dtype, bs).hashes(prompt[:num_tokens])
        encoding = kvlayout.RAW if spec.dtype == "float32" else kvlayout.INT8
        out = [decode_pb2.KvPushMessage(open=decode_pb2.KvPushOpen(
            request_id=request.request_id, spec=spec, num_tokens=num_tokens, start_block=request.start_block))]
        for index in range(request.start_block, -(-num_tokens // bs)):
            n = min(bs, num_tokens - index * bs)
            kv = self.rng.standard_normal((2, spec.num_layers, n, spec.num_kv_heads, spec.head_dim))  # [2, L, n, H, D]
            block = kvlayout.encode(kv, encoding, hashes[index] if n == bs else b"", index)
            block.header.dtype = spec.dtype
            out.append(decode_pb2.KvPushMessage(block=block))
        out.append(decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=len(out) - 1)))
        return out

    async def Prefill(self, request, context):  # noqa: ANN001, N802
        self.requests.append(request)
        frames = self.frames(request)
        blocks = [f.block for f in frames[1:-1]]
        self.sent.append((len(blocks), sum(len(b.data) + len(b.scales) for b in blocks)))
        async with channel(request.destination.endpoint) as chan:
            try:
                reply = await decode_pb2_grpc.DecodeWorkerStub(chan).PushKv(iter(frames), timeout=10.0)
            except grpc.aio.AioRpcError as exc:
                self.replies.append(None)
                self.errors.append(f"{exc.code().name}: {exc.details()}")
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"the destination refused the push: {exc.details()}")
        self.replies.append(reply)
        bs = self.spec.block_size
        return prefill_pb2.PrefillResponse(
            num_computed_tokens=len(request.prompt_token_ids) - 1 - request.start_block * bs,
            num_cached_tokens=request.start_block * bs, blocks_pushed=self.sent[-1][0], bytes_pushed=self.sent[-1][1])


async def learnt_spec(ctx) -> common_pb2.ModelSpec:  # noqa: ANN001 - decode.Session
    """The worker's ModelSpec: `--kv-spec`, else the open of a hand-back Put (D12); skips without."""
    if ctx.opts.kv_spec:
        model_id, dtype, layers, heads, head_dim = ctx.opts.kv_spec.split(",")
        return common_pb2.ModelSpec(model_id=model_id, dtype=dtype, block_size=ctx.opts.block_size,
                                    num_layers=int(layers), num_kv_heads=int(heads), head_dim=int(head_dim))
    need(ctx.store, "needs --kv-spec or --kvstore-port (the worker's ModelSpec is learnt from its hand-back)")
    if not ctx.store.puts:
        await ctx.generate(ctx.request(max_tokens=2))   # a finished turn: something to hand back
        await wait_for(lambda: ctx.store.puts, 3.0)
    specs = [f[0].open.spec for f in ctx.store.puts if f and f[0].WhichOneof("msg") == "open"]
    need(specs and specs[0].num_layers, "the worker handed nothing back and no --kv-spec: its ModelSpec is unknown")
    return specs[0]


async def check_push(ctx, pushed_prompt: list[int]) -> None:  # noqa: ANN001 - decode.Session
    """D22: Generate with the pushing double as `prefill`: the push is answered with the counts
    sent, the stream is whole, and the pushed full blocks are then served from the worker's cache."""
    spec = await learnt_spec(ctx)
    pusher = PushingPrefill(spec)
    served = await serve(0, add(pusher))
    ctx.doubles.append(served)
    request = ctx.request(prompt=pushed_prompt, max_tokens=6)
    request.prefill.CopyFrom(common_pb2.WorkerRef(worker_id="conform-pusher", endpoint=served.endpoint))
    check_framing(await ctx.generate(request), len(pushed_prompt))
    need(pusher.requests, "the worker never asked the prefill worker (it always prefills locally: allowed by D10)")
    expect(not pusher.errors, f"the worker refused a valid push: {pusher.errors}")
    reply, (blocks, nbytes) = pusher.replies[0], pusher.sent[0]
    expect((reply.blocks_received, reply.bytes_received) == (blocks, nbytes),
           f"PushKvResponse says {reply.blocks_received} blocks / {reply.bytes_received} bytes, "
           f"sent {blocks} / {nbytes}")
    full = (len(pushed_prompt) - 1) // spec.block_size - pusher.requests[0].start_block
    expect(full > 0, f"the worker asked for no full block of a prompt it has never seen "
                     f"(start_block {pusher.requests[0].start_block})")
    again = await ctx.generate(ctx.request(prompt=pushed_prompt, max_tokens=2))
    cached = again[-1].usage.cached_tokens
    expect(cached >= full * spec.block_size,
           f"a Generate of the pushed prompt reports {cached} cached tokens; the {full} pushed full blocks are "
           f"{full * spec.block_size}")
