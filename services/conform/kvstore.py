"""Suite of the kvstore role (clauses K1.. of docs/contracts.md)."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from dataclasses import dataclass, field

import grpc
import numpy as np

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc

from . import kvlayout, natsclauses
from .clauses import Registry, collect_stream, expect, expect_status
from .probe import Watcher, channel, expect_serving, need, wait_for

REGISTRY = Registry("kvstore", "K")
clause = REGISTRY.clause
INVALID = grpc.StatusCode.INVALID_ARGUMENT
SPEC = dict(dtype="float32", num_layers=2, num_kv_heads=2, head_dim=4)   # block_size: the mesh's


@dataclass(slots=True)
class Session:
    opts: object
    endpoint: str
    channel: grpc.aio.Channel
    stub: kvstore_pb2_grpc.KvStoreStub
    watcher: Watcher | None
    spec: common_pb2.ModelSpec
    worker_id: str = ""
    stored: list[bytes] = field(default_factory=list)   # hashes put by K2, in chain order
    values: list[np.ndarray] = field(default_factory=list)

    def chain(self, n: int, salt: str) -> tuple[list[bytes], list[np.ndarray]]:
        """`n` blocks of seeded random KV with their chained hashes (unique per session and salt)."""
        hasher = BlockHasher(self.spec.model_id, self.spec.dtype, self.spec.block_size)
        tokens = [zlib.crc32(f"{salt}/{i}".encode()) % 50_000 for i in range(n * self.spec.block_size)]
        rng = np.random.default_rng(len(salt) + n)
        shape = (2, self.spec.num_layers, self.spec.block_size, self.spec.num_kv_heads, self.spec.head_dim)
        return hasher.hashes(tokens), [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]

    def put_stream(self, hashes: list[bytes], values: list[np.ndarray], encoding: int = kvlayout.RAW,
                   commit: int | None = None, parent: bytes = b"") -> list[kvstore_pb2.PutMessage]:
        msgs = [kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(spec=self.spec, producer_id="conform", parent_hash=parent))]
        msgs += [kvstore_pb2.PutMessage(block=kvlayout.encode(v, encoding, h, i)) for i, (h, v) in enumerate(zip(hashes, values))]
        if commit is not None:
            msgs.append(kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=commit)))
        return msgs

    async def lookup(self, hashes: list[bytes], lease_s: float = 0.0) -> kvstore_pb2.LookupResponse:
        return await self.stub.Lookup(kvstore_pb2.LookupRequest(spec=self.spec, block_hashes=hashes, lease_s=lease_s), timeout=10)

    async def close(self) -> None:
        if self.watcher:
            await self.watcher.close()
        await self.channel.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    chan = channel(opts.endpoint)
    spec = common_pb2.ModelSpec(model_id=f"conform-{uuid.uuid4().hex[:8]}", block_size=opts.block_size, **SPEC)
    watcher = await Watcher.start(opts.nats, "kvstore") if opts.nats else None
    return Session(opts, opts.endpoint, chan, kvstore_pb2_grpc.KvStoreStub(chan), watcher, spec)


@clause(1, "health: grpc.health.v1 answers SERVING for the server and kvmesh.v1.KvStore")
async def health(ctx: Session) -> None:
    await expect_serving(ctx.channel, ("kvmesh.v1.KvStore",))


@clause(2, "two-phase Put: committed blocks are stored and Lookup finds the whole chain under a lease")
async def put_commit(ctx: Session) -> None:
    hashes, values = ctx.chain(3, "k2")
    expect((await ctx.lookup(hashes)).num_blocks == 0, "blocks found before they were put")
    reply = await ctx.stub.Put(iter(ctx.put_stream(hashes, values, commit=3)), timeout=10)
    expect((reply.stored, reply.duplicates) == (3, 0), f"Put of 3 new blocks answered stored={reply.stored} duplicates={reply.duplicates}")
    found = await ctx.lookup(hashes)
    expect(found.num_blocks == 3, f"Lookup after commit found {found.num_blocks} of 3 blocks")
    expect(found.lease_id and found.lease_expires_in_s > 0, "Lookup that found blocks granted no lease")
    ctx.stored, ctx.values = hashes, values


@clause(3, "a Put stream that ends without commit stores nothing and fails INVALID_ARGUMENT")
async def put_no_commit(ctx: Session) -> None:
    hashes, values = ctx.chain(2, "k3")
    await expect_status(ctx.stub.Put(iter(ctx.put_stream(hashes, values)), timeout=10), INVALID,
                        grpc.StatusCode.FAILED_PRECONDITION, what="Put without commit")
    expect((await ctx.lookup(hashes)).num_blocks == 0, "blocks of an uncommitted Put became visible")


@clause(4, "a commit whose num_blocks differs from the blocks sent fails INVALID_ARGUMENT and stores nothing")
async def put_bad_commit(ctx: Session) -> None:
    hashes, values = ctx.chain(2, "k4")
    await expect_status(ctx.stub.Put(iter(ctx.put_stream(hashes, values, commit=3)), timeout=10), INVALID, what="commit 3 of 2")
    expect((await ctx.lookup(hashes)).num_blocks == 0, "blocks of a refused commit became visible")


@clause(5, "Put is idempotent: the same blocks again are counted as duplicates, stored once")
async def put_twice(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    reply = await ctx.stub.Put(iter(ctx.put_stream(ctx.stored, ctx.values, commit=3)), timeout=10)
    expect((reply.stored, reply.duplicates) == (0, 3), f"second Put answered stored={reply.stored} duplicates={reply.duplicates}")


@clause(6, "malformed Put frames fail INVALID_ARGUMENT: no open first, bad checksum, shape off the spec")
async def put_malformed(ctx: Session) -> None:
    hashes, values = ctx.chain(1, "k6")
    good = ctx.put_stream(hashes, values, commit=1)
    await expect_status(ctx.stub.Put(iter(good[1:]), timeout=10), INVALID, what="Put without open")
    bad_sum = [kvstore_pb2.PutMessage() for _ in good]
    for dst, src in zip(bad_sum, good):
        dst.CopyFrom(src)
    bad_sum[1].block.header.checksum ^= 1
    await expect_status(ctx.stub.Put(iter(bad_sum), timeout=10), INVALID, what="block with a wrong checksum")
    wrong_shape = ctx.put_stream(hashes, [values[0][:, :1]], commit=1)
    await expect_status(ctx.stub.Put(iter(wrong_shape), timeout=10), INVALID, what="block with 1 of 2 layers")
    expect((await ctx.lookup(hashes)).num_blocks == 0, "a refused block became visible")


@clause(7, "Lookup returns the longest contiguous held prefix; other specs share no keys")
async def lookup_prefix(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    unknown = bytes(32)
    got = (await ctx.lookup([*ctx.stored[:2], unknown, ctx.stored[2]])).num_blocks
    expect(got == 2, f"Lookup of [h0, h1, unknown, h2] found {got}, expected 2")
    got = (await ctx.lookup([unknown, *ctx.stored])).num_blocks
    expect(got == 0, f"Lookup starting with an unknown hash found {got}, expected 0")
    other = common_pb2.ModelSpec()
    other.CopyFrom(ctx.spec)
    other.model_id += "-other"
    reply = await ctx.stub.Lookup(kvstore_pb2.LookupRequest(spec=other, block_hashes=ctx.stored), timeout=10)
    expect(reply.num_blocks == 0, f"Lookup under another model's spec found {reply.num_blocks} blocks")


@clause(8, "leases: lease_expires_in_s is in (0, requested] and bounded")
async def leases(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    reply = await ctx.lookup(ctx.stored, lease_s=0.5)
    expect(0 < reply.lease_expires_in_s <= 0.5, f"asked for a 0.5s lease, got {reply.lease_expires_in_s}s")
    long = await ctx.lookup(ctx.stored, lease_s=10**9)
    expect(0 < long.lease_expires_in_s < 10**9, "a lease of 10^9 s was granted unbounded")


@clause(9, "Get streams the named blocks in order, RAW bytes identical to what was put")
async def get_raw(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    lease = await ctx.lookup(ctx.stored)
    blocks = await collect_stream(ctx.stub.Get(kvstore_pb2.GetRequest(
        spec=ctx.spec, block_hashes=ctx.stored, lease_id=lease.lease_id, encoding=kvlayout.RAW), timeout=10))
    expect([b.header.block_hash for b in blocks] == ctx.stored, "Get returned other blocks or another order")
    for block, values in zip(blocks, ctx.values):
        problem = kvlayout.header_problem(block, ctx.spec, kvlayout.RAW)
        expect(not problem, problem)
        expect(np.array_equal(kvlayout.decode(block, list(values.shape), "float32"), values), "RAW bytes changed in the store")


@clause(10, "Get converts to INT8 and INT4 with the documented layout (scales, packing, checksum)")
async def get_quantized(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    for encoding in (kvlayout.INT8, kvlayout.INT4):
        blocks = await collect_stream(ctx.stub.Get(kvstore_pb2.GetRequest(
            spec=ctx.spec, block_hashes=ctx.stored, encoding=encoding), timeout=10))
        expect(len(blocks) == len(ctx.stored), f"Get returned {len(blocks)} of {len(ctx.stored)} blocks")
        for block, values in zip(blocks, ctx.values):
            problem = kvlayout.header_problem(block, ctx.spec, encoding)
            expect(not problem, problem)
            error = float(np.abs(kvlayout.decode(block, list(values.shape), "float32") - values).max())
            expect(error <= kvlayout.tolerance(values, encoding),
                   f"{common_pb2.KvEncoding.Name(encoding)} block decodes {error:.4f} away (layout mismatch?)")


@clause(11, "a quantized Put round-trips: INT8/INT4 blocks put are returned RAW within their step")
async def put_quantized(ctx: Session) -> None:
    for encoding in (kvlayout.INT8, kvlayout.INT4):
        hashes, values = ctx.chain(2, f"k11-{encoding}")
        await ctx.stub.Put(iter(ctx.put_stream(hashes, values, encoding=encoding, commit=2)), timeout=10)
        blocks = await collect_stream(ctx.stub.Get(kvstore_pb2.GetRequest(spec=ctx.spec, block_hashes=hashes), timeout=10))
        for block, v in zip(blocks, values):
            error = float(np.abs(kvlayout.decode(block, list(v.shape), "float32") - v).max())
            expect(error <= kvlayout.tolerance(v, encoding), f"{common_pb2.KvEncoding.Name(encoding)} put came back {error:.4f} off")


@clause(12, "Get of a block not held fails NOT_FOUND; Stats answers")
async def get_missing(ctx: Session) -> None:
    call = collect_stream(ctx.stub.Get(kvstore_pb2.GetRequest(spec=ctx.spec, block_hashes=[bytes(32)]), timeout=10))
    await expect_status(call, grpc.StatusCode.NOT_FOUND, what="Get of an unknown hash")
    stats = await ctx.stub.Stats(kvstore_pb2.StatsRequest(), timeout=10)
    expect(stats.puts >= 1, f"Stats counts {stats.puts} puts after several")


@clause(13, "heartbeat: kvmesh.workers.kvstore.<id>.heartbeat, role KVSTORE, own endpoint, every <= 2 s")
async def heartbeat(ctx: Session) -> None:
    await natsclauses.check_heartbeat(ctx, "kvstore")


@clause(14, "KV events: committed blocks appear as BlockStored in batches numbered +1 from 1")
async def kv_events(ctx: Session) -> None:
    watcher = natsclauses.watcher_of(ctx)
    worker_id = ctx.worker_id or await watcher.worker_id(ctx.endpoint)
    ctx.worker_id = worker_id
    hashes, values = ctx.chain(2, "k14")
    await ctx.stub.Put(iter(ctx.put_stream(hashes, values, commit=2)), timeout=10)

    def announced() -> bool:
        seen = {h for b in watcher.batches.get(worker_id, []) for e in b.events for h in e.stored.block_hashes}
        return set(hashes) <= seen

    expect(await wait_for(announced, 5.0), f"committed blocks never appeared on kvmesh.kv.events.{worker_id}")
    await natsclauses.check_kv_events(ctx)


@clause(15, "KV event replay: from a seen seq returns those batches or a full dump; beyond the end, none")
async def replay(ctx: Session) -> None:
    await natsclauses.check_replay(ctx)


@clause(16, "a lease pins: a Put that needs leased blocks' room fails RESOURCE_EXHAUSTED until the lease expires, then succeeds")
async def lease_pins(ctx: Session) -> None:
    need(ctx.opts.store_bytes, "needs --store-bytes (the store's capacity: this clause fills it)")
    block_bytes = kvlayout.expected_lengths(ctx.spec, ctx.spec.block_size, kvlayout.RAW)[0]
    fill = ctx.opts.store_bytes // block_bytes
    hashes, values = ctx.chain(fill + 1, "k17")
    await ctx.stub.Put(iter(ctx.put_stream(hashes[:fill], values[:fill], commit=fill)), timeout=30)
    leased = await ctx.lookup(hashes[:fill], lease_s=1.0)
    expect(leased.num_blocks == fill, f"the store kept {leased.num_blocks} of the {fill} blocks that fill it")
    one_more = ctx.put_stream(hashes[fill:], values[fill:], commit=1, parent=hashes[fill - 1])
    error = await expect_status(ctx.stub.Put(iter(one_more), timeout=10), grpc.StatusCode.RESOURCE_EXHAUSTED,
                                what="a Put into a store full of leased blocks")
    expect(any(k == "retry-after" for k, _ in error.trailing_metadata() or ()), "RESOURCE_EXHAUSTED without a retry-after trailer")
    await asyncio.sleep(1.2)
    reply = await ctx.stub.Put(iter(one_more), timeout=10)
    expect(reply.stored == 1, f"after the lease expired the Put stored {reply.stored}")


@clause(18, "a `blocks` message stores its blocks as `block` messages would; `new_chain` starts another chain after its parent_hash")
async def put_batches(ctx: Session) -> None:
    a_hashes, a_values = ctx.chain(3, "k18a")
    b_hashes, b_values = ctx.chain(3, "k18b")
    a = [kvlayout.encode(v, kvlayout.RAW, h, i) for i, (h, v) in enumerate(zip(a_hashes, a_values))]
    b = [kvlayout.encode(v, kvlayout.RAW, h, i) for i, (h, v) in enumerate(zip(b_hashes, b_values))][1:]  # b1.. after b0

    def stream(*batches: kvstore_pb2.KvBlockBatch, commit: int = 5) -> list[kvstore_pb2.PutMessage]:
        opened = kvstore_pb2.PutOpen(spec=ctx.spec, producer_id="conform")
        return [kvstore_pb2.PutMessage(open=opened), *(kvstore_pb2.PutMessage(blocks=x) for x in batches),
                kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=commit))]

    batches = (kvstore_pb2.KvBlockBatch(blocks=a[:2]), kvstore_pb2.KvBlockBatch(blocks=a[2:]),
               kvstore_pb2.KvBlockBatch(blocks=b, new_chain=True, parent_hash=b_hashes[0]))
    await expect_status(ctx.stub.Put(iter(stream(*batches, commit=4)), timeout=10), INVALID, what="commit 4 of 5 batched blocks")
    bad = kvstore_pb2.KvBlockBatch()
    bad.CopyFrom(batches[1])
    bad.blocks[0].header.checksum ^= 1
    await expect_status(ctx.stub.Put(iter(stream(batches[0], bad, batches[2])), timeout=10), INVALID,
                        what="a batched block with a wrong checksum")
    expect((await ctx.lookup(a_hashes)).num_blocks == 0, "blocks of a refused batched Put became visible")
    reply = await ctx.stub.Put(iter(stream(*batches)), timeout=10)
    expect((reply.stored, reply.duplicates) == (5, 0), f"batched Put of 5 new blocks answered stored={reply.stored} duplicates={reply.duplicates}")
    expect((await ctx.lookup(a_hashes)).num_blocks == 3, "the first chain of a batched Put is not found whole")
    expect((await ctx.lookup(b_hashes[1:])).num_blocks == 2, "the chain a `new_chain` batch started is not found")
    if ctx.watcher is None or not ctx.worker_id:  # the events part needs NATS and K14's worker id
        return
    worker_id = ctx.worker_id

    def parent_of(first: bytes) -> bytes | None:
        for batch in ctx.watcher.batches.get(worker_id, []):
            for event in batch.events:
                if event.WhichOneof("event") == "stored" and event.stored.block_hashes[:1] == [first]:
                    return event.stored.parent_hash
        return None

    expect(await wait_for(lambda: parent_of(b_hashes[1]) is not None, 5.0), "the batched blocks never appeared as BlockStored")
    expect(parent_of(b_hashes[1]) == b_hashes[0], "BlockStored of a `new_chain` batch does not name its parent_hash")
    expect(parent_of(a_hashes[0]) == b"", "BlockStored of a Put's first chain names a parent it did not have")


@clause(19, "LookupChains (optional): each chain answered as its own Lookup would be, in order; lease_s < 0 leases "
            "nothing; bad input INVALID_ARGUMENT")
async def lookup_chains(ctx: Session) -> None:
    expect(ctx.stored, "needs K2's blocks")
    unknown = bytes(32)
    chains = [ctx.stored, [*ctx.stored[:2], unknown, ctx.stored[2]], [unknown, *ctx.stored], [], ctx.stored[:1]]

    def request(chains: list[list[bytes]], lease_s: float = 0.0, spec: common_pb2.ModelSpec = ctx.spec):  # noqa: ANN202
        return kvstore_pb2.LookupChainsRequest(spec=spec, lease_s=lease_s,
                                               chains=[kvstore_pb2.HashChain(block_hashes=c) for c in chains])

    try:
        reply = await ctx.stub.LookupChains(request(chains), timeout=10)
    except grpc.aio.AioRpcError as exc:
        need(exc.code() != grpc.StatusCode.UNIMPLEMENTED, "the store has no LookupChains (optional: a client asks a Lookup per chain)")
        raise
    got = [c.num_blocks for c in reply.chains]
    expect(got == [3, 2, 0, 0, 1], f"LookupChains of [K2, [h0, h1, unknown, h2], [unknown, K2...], [], [h0]] found {got}, "
                                   "expected [3, 2, 0, 0, 1]")
    leased = [c for c in reply.chains if c.num_blocks]
    expect(all(c.lease_id and c.lease_expires_in_s > 0 for c in leased), "a chain LookupChains found has no lease")
    unleased = (await ctx.stub.LookupChains(request(chains, lease_s=-1), timeout=10)).chains
    expect([c.num_blocks for c in unleased] == got, "LookupChains with lease_s < 0 found other blocks")
    expect(not any(c.lease_id or c.lease_expires_in_s for c in unleased), "LookupChains with lease_s < 0 granted a lease")
    other = common_pb2.ModelSpec()
    other.CopyFrom(ctx.spec)
    other.model_id = ""
    await expect_status(ctx.stub.LookupChains(request(chains, spec=other), timeout=10), INVALID, what="a spec without model_id")
    await expect_status(ctx.stub.LookupChains(request([ctx.stored, [bytes(31)]]), timeout=10), INVALID, what="a 31-byte hash")
    too_many = [[unknown] * 40_000, [unknown] * 25_537]  # 65,537 hashes in all
    await expect_status(ctx.stub.LookupChains(request(too_many), timeout=10), INVALID, what="65,537 hashes in one call")


@clause(20, "a `runs` message (optional) stores the blocks its runs pack as `blocks` would; a bad run is INVALID_ARGUMENT "
            "and nothing of it is stored")
async def put_runs(ctx: Session) -> None:
    hashes, values = ctx.chain(4, "k20")
    blocks = [kvlayout.encode(v, kvlayout.RAW, h, i) for i, (h, v) in enumerate(zip(hashes, values))]

    def stream(run: kvstore_pb2.KvBlockRun, commit: int = 4) -> list[kvstore_pb2.PutMessage]:
        opened = kvstore_pb2.PutOpen(spec=ctx.spec, producer_id="conform")
        return [kvstore_pb2.PutMessage(open=opened), kvstore_pb2.PutMessage(runs=kvstore_pb2.KvBlockRuns(runs=[run])),
                kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=commit))]

    def run_of(chosen: list[common_pb2.KvBlock], first: int = 0) -> kvstore_pb2.KvBlockRun:
        return kvstore_pb2.KvBlockRun(block_hashes=[b.header.block_hash for b in chosen], checksums=[b.header.checksum for b in chosen],
                                      first_index=first, encoding=kvlayout.RAW, data=b"".join(b.data for b in chosen))

    bad = run_of(blocks)
    bad.checksums[2] ^= 1
    error = await expect_status(ctx.stub.Put(iter(stream(bad)), timeout=10), INVALID, what="a run with a wrong checksum")
    need("unexpected empty message" not in (error.details() or ""),
         "the store has no KvBlockRun (optional: a client sends the blocks as `blocks` messages)")
    short = run_of(blocks)
    short.data = short.data[:-4]
    await expect_status(ctx.stub.Put(iter(stream(short)), timeout=10), INVALID, what="a run whose data is 4 bytes short")
    expect((await ctx.lookup(hashes)).num_blocks == 0, "blocks of a refused run became visible")
    reply = await ctx.stub.Put(iter(stream(run_of(blocks))), timeout=10)
    expect((reply.stored, reply.duplicates) == (4, 0), f"a run of 4 new blocks answered stored={reply.stored} duplicates={reply.duplicates}")
    expect((await ctx.lookup(hashes)).num_blocks == 4, "the blocks of a run are not found whole")
    got = await collect_stream(ctx.stub.Get(kvstore_pb2.GetRequest(spec=ctx.spec, block_hashes=hashes), timeout=10))
    expect([b.data for b in got] == [b.data for b in blocks], "Get of a run's blocks returned other bytes than were put")


@clause(17, "drain: SIGTERM → a heartbeat with draining=true and health no longer SERVING")
async def drain(ctx: Session) -> None:
    await natsclauses.check_drain(ctx, "kvstore")
