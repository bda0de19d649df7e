"""gRPC client of a sharded KV store: prefix lookups fan out per shard, Gets and Puts go to owners.

Every block's owner comes from `kvshards.rank` over the live shards. A shard that fails a call
costs only its blocks: the prefix ends at its first block, the caller recomputes from there, and
the directory leaves that shard out until it heartbeats again. Blocks read more than `hot_hits`
times (counted by this client) are copied to the next `replicas - 1` shards in rendezvous order,
where lookups go once their owner is gone. `lookup_chains` asks each shard about several
sequences in one `LookupChains` call (a shard that answers UNIMPLEMENTED, an older store, gets a
unary Lookup per sequence for UNARY_RETRY_S before the batched call is tried again). Puts carry whole chains (`Chain`: a sequence's
consecutive blocks and the block before them), several per Put, in `blocks` (or, for a `BlockRun`,
`runs`) messages of at most PUT_MESSAGE_BYTES (kvstoremsgs.py builds the messages). A shard older
than `KvBlockRun` refuses a run as "unexpected empty message": that Put is sent again with the
run's blocks as `KvBlock`s, and so is every later one to that shard. No torch: blocks stay
protobuf here, a Get's as their bytes with the header read (`kvwire.BlockFrame`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from . import kvwire
from .errors import MeshError
from .grpcutil import ChannelPool
from .kvshards import Shard, ShardDirectory, contiguous_prefix, rank, split_by_owner
from .kvstoremsgs import BlockRun, Chain, lookup_chains_requests, put_frames, renumbered, runs
from .pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc
from .telemetry import inject_metadata

log = logging.getLogger(__name__)

MAX_HOT_TRACKED = 65_536  # hit counters kept for replication decisions
OLD_STORE_PUT = "unexpected empty message"  # a store older than KvBlockRun, handed a `runs` message
UNARY_RETRY_S = 300.0  # a shard without LookupChains gets unary Lookups this long before it is asked again
NO_LEASE = -1.0  # lookup_chains' lease_s for "what is held" only
PUT_METHOD = "/kvmesh.v1.KvStore/Put"
GET_METHOD = "/kvmesh.v1.KvStore/Get"


@dataclass(frozen=True, slots=True)
class _Calls:
    """A shard's calls on one channel: the stub, `Put` sending messages already serialized
    (`put_frames`), and `Get` answering its blocks' bytes unparsed (`kvwire.read_frame`)."""

    channel: grpc.aio.Channel
    stub: kvstore_pb2_grpc.KvStoreStub
    put: grpc.aio.StreamUnaryMultiCallable
    get: grpc.aio.UnaryStreamMultiCallable

    @classmethod
    def of(cls, channel: grpc.aio.Channel) -> _Calls:
        put = channel.stream_unary(PUT_METHOD, request_serializer=None, response_deserializer=kvstore_pb2.PutResponse.FromString)
        get = channel.unary_stream(GET_METHOD, request_serializer=kvstore_pb2.GetRequest.SerializeToString,
                                   response_deserializer=None)
        return cls(channel, kvstore_pb2_grpc.KvStoreStub(channel), put, get)


@dataclass(slots=True)
class ShardedLookup:
    num_blocks: int                       # leading blocks held mesh-wide (and leased on their shards)
    owners: list[Shard]                   # owner of each leading block
    leases: dict[Shard, str]


class ShardedStore:
    def __init__(
        self, directory: ShardDirectory, channels: ChannelPool, spec: common_pb2.ModelSpec, timeout_s: float,
        put_timeout_s: float = 10.0, replicas: int = 1, hot_hits: int = 0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.spec = spec
        self.timeout_s = timeout_s
        self.put_timeout_s = put_timeout_s
        self.replicas = max(1, replicas)
        self.hot_hits = hot_hits
        self.replicated = 0
        self.failures = 0  # calls a shard failed
        self._channels = channels
        self._stubs: dict[str, _Calls] = {}  # endpoint -> its calls
        self._no_runs: set[str] = set()  # endpoints of stores older than KvBlockRun
        self._hits: Counter[bytes] = Counter()
        self._background: set[asyncio.Task] = set()
        self._clock = clock
        self._unary_until: dict[str, float] = {}  # endpoint -> when to try its LookupChains again

    def _calls(self, shard: Shard) -> _Calls:
        """The shard's calls, made once per channel (a channel the pool replaced gets new ones)."""
        channel = self._channels.get(shard.endpoint)
        cached = self._stubs.get(shard.endpoint)
        if cached is None or cached.channel is not channel:
            cached = self._stubs[shard.endpoint] = _Calls.of(channel)
        return cached

    def _stub(self, shard: Shard) -> kvstore_pb2_grpc.KvStoreStub:
        return self._calls(shard).stub

    def _put_call(self, shard: Shard) -> grpc.aio.StreamUnaryMultiCallable:
        return self._calls(shard).put

    def _failed(self, shard: Shard, call: str, exc: Exception) -> None:
        self.failures += 1
        detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        log.warning("KV store shard %s (%s) failed %s: %s; its blocks are recomputed", shard.shard_id, shard.endpoint, call, detail)
        self.directory.forget(shard)

    async def lookup(self, hashes: Sequence[bytes]) -> ShardedLookup:
        """Asks each owner shard for the leading blocks of its share of `hashes` (concurrently)."""
        shards = self.directory.shards()
        if not shards or not hashes:
            return ShardedLookup(0, [], {})
        groups = split_by_owner(hashes, shards)

        async def ask(shard: Shard, positions: list[int]) -> kvstore_pb2.LookupResponse | None:
            request = kvstore_pb2.LookupRequest(spec=self.spec, block_hashes=[hashes[i] for i in positions])
            try:
                return await self._stub(shard).Lookup(request, timeout=self.timeout_s, metadata=inject_metadata())
            except (grpc.aio.AioRpcError, MeshError) as exc:
                self._failed(shard, "Lookup", exc)
                return None

        replies = dict(zip(groups, await asyncio.gather(*(ask(s, p) for s, p in groups.items()))))
        return _sharded_lookup(len(hashes), groups, {s: r for s, r in replies.items() if r is not None})

    async def lookup_chains(self, chains: Sequence[Sequence[bytes]], lease_s: float = 0.0) -> list[ShardedLookup]:
        """`lookup` of each chain, with one call per shard for all of them (concurrently); `lease_s`
        as in LookupChains (NO_LEASE: only what is held)."""
        shards = self.directory.shards()
        groups = [split_by_owner(hashes, shards) if shards else {} for hashes in chains]
        by_shard: dict[Shard, list[int]] = {}  # shard -> the chains with blocks there
        for n, owned in enumerate(groups):
            for shard in owned:
                by_shard.setdefault(shard, []).append(n)

        async def ask(shard: Shard, ns: list[int]) -> dict[int, kvstore_pb2.LookupResponse] | None:
            shares = [[chains[n][i] for i in groups[n][shard]] for n in ns]
            replies = await self._lookup_shares(shard, shares, lease_s)
            return None if replies is None else dict(zip(ns, replies))

        answers = dict(zip(by_shard, await asyncio.gather(*(ask(s, ns) for s, ns in by_shard.items()))))
        return [
            _sharded_lookup(len(chains[n]), owned, {s: answers[s][n] for s in owned if answers[s] is not None})
            for n, owned in enumerate(groups)
        ]

    async def _lookup_shares(self, shard: Shard, shares: list[list[bytes]], lease_s: float) -> list[kvstore_pb2.LookupResponse] | None:
        """The shard's answer for each of `shares` (LookupChains calls of at most LOOKUP_CHAINS_HASHES
        hashes; unary Lookups on a store without it); None when the shard failed."""
        if self._clock() >= self._unary_until.get(shard.endpoint, 0.0):
            try:
                replies = []
                for request in lookup_chains_requests(self.spec, shares, lease_s):
                    reply = await self._stub(shard).LookupChains(request, timeout=self.timeout_s, metadata=inject_metadata())
                    replies.extend(reply.chains)
                if len(replies) != len(shares):
                    raise ValueError(f"LookupChains answered {len(replies)} chains of {len(shares)}")
                return replies
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    self._failed(shard, "LookupChains", exc)
                    return None
                log.info("KV store shard %s has no LookupChains: unary Lookups for %.0f s", shard.shard_id, UNARY_RETRY_S)
                self._unary_until[shard.endpoint] = self._clock() + UNARY_RETRY_S
            except (MeshError, ValueError) as exc:
                self._failed(shard, "LookupChains", exc)
                return None
        try:
            return list(await asyncio.gather(*(
                self._stub(shard).Lookup(kvstore_pb2.LookupRequest(spec=self.spec, block_hashes=share, lease_s=lease_s),
                                         timeout=self.timeout_s, metadata=inject_metadata())
                for share in shares
            )))
        except (grpc.aio.AioRpcError, MeshError) as exc:
            self._failed(shard, "Lookup", exc)
            return None

    async def get(self, hashes: Sequence[bytes], skip: int, found: ShardedLookup, encoding: int) -> list[kvwire.BlockFrame]:
        """Blocks `skip..found.num_blocks` of `hashes`, in order, from their owners (concurrently),
        as their messages' bytes with the header read (`kvwire.BlockFrame`: the caller parses the
        rest off the event loop). Stops short at the first block whose shard failed."""
        by_shard: dict[Shard, list[int]] = {}
        for i in range(skip, found.num_blocks):
            by_shard.setdefault(found.owners[i], []).append(i)
        got: dict[int, kvwire.BlockFrame] = {}
        end = found.num_blocks

        async def fetch(shard: Shard, positions: list[int]) -> None:
            nonlocal end
            wanted = [hashes[i] for i in positions]
            request = kvstore_pb2.GetRequest(spec=self.spec, block_hashes=wanted, lease_id=found.leases.get(shard, ""),
                                             encoding=encoding)
            k = 0
            try:
                async for frame in self._calls(shard).get(request, timeout=self.timeout_s * 4, metadata=inject_metadata()):
                    block = kvwire.read_frame(frame)
                    if k >= len(positions) or block.header.block_hash != wanted[k]:
                        raise ValueError(f"shard sent an unexpected block at position {positions[min(k, len(positions) - 1)]}")
                    got[positions[k]] = block
                    k += 1
            except (grpc.aio.AioRpcError, MeshError, ValueError) as exc:
                self._failed(shard, "Get", exc)
            if k < len(positions):
                end = min(end, positions[k])

        await asyncio.gather(*(fetch(s, p) for s, p in by_shard.items()))
        blocks = [got[i] for i in range(skip, end)]
        self._count_hits(blocks)
        return blocks

    async def put(self, producer_id: str, blocks: Sequence[common_pb2.KvBlock], parent_hash: bytes = b"") -> tuple[int, int]:
        """Puts consecutive `blocks` of one sequence (`parent_hash`: the block before the first,
        empty for none) to their owner shards; (stored, duplicates)."""
        return await self.put_chains(producer_id, [Chain(list(blocks), parent_hash)])

    async def put_chains(self, producer_id: str, chains: Sequence[Chain]) -> tuple[int, int]:
        """Puts the blocks of several sequences with one two-phase Put per owner shard; (stored,
        duplicates). A shard's share of a sequence goes as chains of contiguous blocks, each with
        the block before it as parent."""
        shards = self.directory.shards()
        if not shards:
            return 0, 0
        by_shard: dict[Shard, list[Chain]] = {}
        for chain in chains:
            if not chain.blocks:
                continue
            groups = split_by_owner(chain.hashes, shards)
            for shard, positions in groups.items():
                by_shard.setdefault(shard, []).extend(runs(chain, positions))
        results = await asyncio.gather(*(self._put_to(s, producer_id, runs) for s, runs in by_shard.items()))
        return sum(r[0] for r in results), sum(r[1] for r in results)

    async def _put_to(self, shard: Shard, producer_id: str, chains: list[Chain]) -> tuple[int, int]:
        runs_ok = shard.endpoint not in self._no_runs
        try:
            try:
                reply = await self._put(shard, producer_id, chains, runs_ok)
            except grpc.aio.AioRpcError as exc:
                if not (runs_ok and _refused_run(exc) and any(isinstance(c.blocks, BlockRun) for c in chains)):
                    raise
                log.info("KV store shard %s (%s) takes no KvBlockRun; its Puts carry KvBlocks", shard.shard_id, shard.endpoint)
                self._no_runs.add(shard.endpoint)
                reply = await self._put(shard, producer_id, chains, False)
        except (grpc.aio.AioRpcError, MeshError) as exc:
            self._failed(shard, "Put", exc)
            return 0, 0
        return reply.stored, reply.duplicates

    async def _put(self, shard: Shard, producer_id: str, chains: list[Chain], runs_ok: bool) -> kvstore_pb2.PutResponse:
        frames = put_frames(self.spec, producer_id, chains, runs_ok=runs_ok)
        return await self._put_call(shard)(iter(frames), timeout=self.put_timeout_s, metadata=inject_metadata())

    def _count_hits(self, blocks: list[kvwire.BlockFrame]) -> None:
        if self.replicas < 2 or self.hot_hits <= 0:
            return
        hot = []
        for block in blocks:
            block_hash = block.header.block_hash
            self._hits[block_hash] += 1
            if self._hits[block_hash] == self.hot_hits:
                hot.append(block)
        if len(self._hits) > MAX_HOT_TRACKED:
            self._hits = Counter(dict(self._hits.most_common(MAX_HOT_TRACKED // 2)))
        if hot:
            task = asyncio.create_task(self._replicate(hot))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _replicate(self, frames: list[kvwire.BlockFrame]) -> None:
        """Copies hot blocks to the shards ranked 2..R for each (the owner already has them)."""
        try:
            blocks = await asyncio.to_thread(lambda: [f.block() for f in frames])  # NOTE: a parse is a copy a block
        except ValueError as exc:
            log.warning("hot KV blocks not replicated: %s", exc)
            return
        shards = self.directory.shards()
        by_shard: dict[Shard, list[common_pb2.KvBlock]] = {}
        for block in blocks:
            for shard in rank(block.header.block_hash, shards)[1 : self.replicas]:
                by_shard.setdefault(shard, []).append(block)
        for shard, copies in by_shard.items():
            stored, _ = await self._put_to(shard, "replica", [Chain(renumbered(copies))])
            self.replicated += stored


def _sharded_lookup(
    num_hashes: int, groups: dict[Shard, list[int]], replies: dict[Shard, kvstore_pb2.LookupResponse]
) -> ShardedLookup:
    """One sequence's answer from its owner shards' replies (a failed shard has none): the leading
    blocks held across them, each one's owner, and the leases taken."""
    num_blocks = contiguous_prefix(num_hashes, groups, {s: r.num_blocks for s, r in replies.items()})
    owner_of = {i: s for s, positions in groups.items() for i in positions}
    leases = {s: r.lease_id for s, r in replies.items() if r.lease_id}
    return ShardedLookup(num_blocks, [owner_of[i] for i in range(num_blocks)], leases)


def _refused_run(exc: grpc.aio.AioRpcError) -> bool:
    """A store older than KvBlockRun refusing a `runs` message (it reads as an empty one)."""
    return exc.code() == grpc.StatusCode.INVALID_ARGUMENT and OLD_STORE_PUT in (exc.details() or "")
