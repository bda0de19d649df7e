"""The KvStore gRPC servicer: a thin adapter (from_pb → BlockStore → to_pb) plus the KV event feed."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import grpc
from opentelemetry import trace

from kvmesh.runtime import kvevents, kvwire, pbframe
from kvmesh.runtime.errors import FailedPrecondition, InvalidArgument, MeshError, ResourceExhausted
from kvmesh.runtime.grpcutil import parse_request
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2, events_pb2, kvstore_pb2, kvstore_pb2_grpc
from kvmesh.runtime.telemetry import tracer

from . import codec
from .blocks import Block, BlockHeader, Encoding, ModelSpec
from .events import Cleared, Removed, StoreEvent, Stored
from .metrics import StoreMetrics
from .results import LookupResult, PutResult
from .store import BlockStore

log = logging.getLogger(__name__)

T = TypeVar("T")

GET_CHUNK_BLOCKS = 16  # blocks read (from disk) at a time while a Get streams
STAGE_BYTES = 16 * 1024 * 1024  # Put blocks received before the store thread stages them (8 x 2 MiB at 8B sizes)
EVENTS_PER_BATCH = 512  # keeps a KV event batch far below NATS's 1 MiB payload limit


def traced(name: str, **attributes: object) -> AbstractContextManager[trace.Span]:
    """A span `name` under the caller's trace, or none for a call that carries no trace.

    NOTE: a decode worker's hand-back looks every finished turn up untraced; a root span per such
    Lookup was ~10% of the store's CPU for the call and belonged to no request's trace."""
    if not trace.get_current_span().get_span_context().is_valid:
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, attributes=attributes)


def lookup_to_pb(result: LookupResult) -> kvstore_pb2.LookupResponse:
    return kvstore_pb2.LookupResponse(num_blocks=result.num_blocks, lease_id=result.lease_id,
                                      lease_expires_in_s=result.expires_in_s)


def spec_from_pb(pb: common_pb2.ModelSpec) -> ModelSpec:
    return ModelSpec(pb.model_id, pb.dtype, pb.block_size, pb.num_layers, pb.num_kv_heads, pb.head_dim)


def encoding_from_pb(value: int) -> Encoding:
    if value == common_pb2.KV_ENCODING_UNSPECIFIED:
        return Encoding.RAW
    try:
        return Encoding(value)
    except ValueError:
        raise InvalidArgument(f"unknown KV encoding {value}") from None


def block_from_pb(pb: common_pb2.KvBlock) -> Block:
    h = pb.header
    header = BlockHeader(
        block_hash=h.block_hash, block_index=h.block_index, layer_start=h.layer_start, layer_end=h.layer_end,
        dtype=h.dtype, shape=tuple(h.shape), encoding=encoding_from_pb(h.encoding), byte_length=h.byte_length,
        checksum=h.checksum, num_tokens=h.num_tokens, scales_length=h.scales_length,
    )
    return Block(header, pb.data, pb.scales)


def header_to_pb(block: Block) -> common_pb2.KvBlockHeader:
    h = block.header
    return common_pb2.KvBlockHeader(
        block_hash=h.block_hash, block_index=h.block_index, layer_start=h.layer_start, layer_end=h.layer_end,
        dtype=h.dtype, shape=list(h.shape), encoding=int(h.encoding), byte_length=h.byte_length,
        checksum=h.checksum, num_tokens=h.num_tokens, scales_length=h.scales_length,
    )


def block_to_pb(block: Block) -> common_pb2.KvBlock:
    return common_pb2.KvBlock(header=header_to_pb(block), data=block.data, scales=block.scales)


def block_frame(block: Block) -> bytes:
    """`block_to_pb(block)` serialized, its payload joined in once (`kvwire.block_frame`)."""
    return kvwire.block_frame(header_to_pb(block), block.data, block.scales)


def event_to_pb(event: StoreEvent) -> events_pb2.KvEvent:
    if isinstance(event, Stored):
        return kvevents.stored(event.hashes, event.parent)
    if isinstance(event, Removed):
        return kvevents.removed(event.hashes)
    assert isinstance(event, Cleared)
    return kvevents.cleared()


@dataclass(frozen=True, slots=True)
class ChainStart:
    """In a Put's staged blocks: the next block starts another chain after `parent_hash`."""

    parent_hash: bytes


_PUT_KINDS = {pbframe.key(1): "open", pbframe.key(2): "block", pbframe.key(3): "commit", pbframe.key(4): "blocks",
              pbframe.key(5): "runs"}  # PutMessage's oneof, by its field's key


def put_kind(frame: bytes) -> str | None:
    """A Put message's kind from its first key, without parsing it: a message of a oneof is that
    one field (`parse_put` checks the parsed message says the same). None: not one of them."""
    return _PUT_KINDS.get(frame[:1])


def parse_put(frame: bytes, kind: str) -> kvstore_pb2.PutMessage:
    message = parse_request(kvstore_pb2.PutMessage, frame)
    if message.WhichOneof("msg") != kind:
        raise InvalidArgument(f"malformed Put message: it starts as {kind} but is {message.WhichOneof('msg') or 'empty'}")
    return message


def _received(frame: bytes, kind: str) -> list[common_pb2.KvBlock | kvstore_pb2.KvBlockRun | ChainStart]:
    """Store thread: a `block`, `blocks` or `runs` message's blocks (and chain starts; a run whole)."""
    message = parse_put(frame, kind)
    if kind == "runs":
        items: list = []
        for run in message.runs.runs:
            if run.new_chain:
                items.append(ChainStart(run.parent_hash))
            items.append(run)
        return items
    if kind == "block":
        return [message.block]
    starts = [ChainStart(message.blocks.parent_hash)] if message.blocks.new_chain else []
    return [*starts, *message.blocks.blocks]


class EventFeed:
    """Publishes what the store changed as KV event batches (nowhere when there is no bus).

    The store thread `take`s events as it drains them, in the store's order; `publish` sends them
    from the event loop, one caller at a time, so batches keep that order."""

    def __init__(self, publisher: kvevents.KvEventPublisher | None) -> None:
        self.publisher = publisher
        self._pending: deque[StoreEvent] = deque()  # NOTE: deque appends and pops are thread-safe
        self._publishing = asyncio.Lock()

    @property
    def seq(self) -> int:
        return self.publisher.seq if self.publisher else 0

    def take(self, events: list[StoreEvent]) -> None:
        """Store thread: queues `events` for the next `publish`."""
        self._pending.extend(events)

    async def publish(self) -> None:
        if not self._pending:
            return
        async with self._publishing:
            while self._pending:
                chunk = [self._pending.popleft() for _ in range(min(EVENTS_PER_BATCH, len(self._pending)))]
                if self.publisher is not None:
                    await self.publisher.publish([event_to_pb(e) for e in chunk])


class KvStoreServicer(kvstore_pb2_grpc.KvStoreServicer):
    RAW_REQUESTS = ("Put",)  # a Put's blocks are parsed on the store thread (`_received`), not the event loop

    def __init__(
        self, store: BlockStore, metrics: StoreMetrics, feed: EventFeed | None = None, thread: Offload | None = None
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.feed = feed or EventFeed(None)
        self.thread = thread or Offload("kvstore-io")  # every store call runs there, off the event loop

    async def after_change(self) -> None:
        """Publishes pending events and refreshes metrics (also called by the periodic tick)."""
        await self.thread.run(self._settle)
        await self.feed.publish()

    async def tick(self) -> None:
        """Expires leases, abandoned puts and idle blocks, then publishes what that changed."""
        await self.thread.run(self._settled, self.store.tick)
        await self.feed.publish()

    def _settle(self) -> None:
        """Store thread: hands the store's new events to the feed and refreshes the metrics."""
        self.feed.take(self.store.drain_events())
        self.metrics.sync(self.store)

    def _settled(self, fn: Callable[..., T], *args: object) -> T:
        """Store thread: `fn(*args)`, then `_settle` (one trip for a call and what it changed)."""
        try:
            return fn(*args)
        finally:
            self._settle()

    def _read_chunk(self, spec: ModelSpec, hashes: list[bytes], encoding: Encoding) -> list[tuple[bytes, int]]:
        """Store thread: reads blocks (disk included), converts them to the asked encoding and
        serializes them: (a `KvBlock` message's bytes, its payload bytes) a block. The event loop
        only hands the bytes to gRPC (a large block's serializer costs several copies)."""
        blocks = [codec.convert(block, encoding) for block in self.store.read(spec, hashes)]
        return [(block_frame(b), b.header.byte_length + b.header.scales_length) for b in blocks]

    async def Lookup(self, request: kvstore_pb2.LookupRequest, context: grpc.aio.ServicerContext) -> kvstore_pb2.LookupResponse:
        with traced("kvstore.lookup", query_blocks=len(request.block_hashes)) as span:
            try:
                result = await self.thread.run(
                    self._settled, self.store.lookup, spec_from_pb(request.spec), list(request.block_hashes), request.lease_s
                )
            finally:
                await self.feed.publish()
            span.set_attribute("hit_blocks", result.num_blocks)
            return lookup_to_pb(result)

    async def LookupChains(
        self, request: kvstore_pb2.LookupChainsRequest, context: grpc.aio.ServicerContext
    ) -> kvstore_pb2.LookupChainsResponse:
        """Every chain's Lookup in one store-thread trip (a decode worker's hand-back of a batch of turns)."""
        chains = [list(chain.block_hashes) for chain in request.chains]
        with traced("kvstore.lookup_chains", chains=len(chains)) as span:
            try:
                results = await self.thread.run(
                    self._settled, self.store.lookup_chains, spec_from_pb(request.spec), chains, request.lease_s
                )
            finally:
                await self.feed.publish()
            span.set_attribute("hit_blocks", sum(r.num_blocks for r in results))
            return kvstore_pb2.LookupChainsResponse(chains=[lookup_to_pb(r) for r in results])

    async def Get(self, request: kvstore_pb2.GetRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[common_pb2.KvBlock]:
        hashes = list(request.block_hashes)
        with traced("kvstore.get", blocks=len(hashes)) as span:
            spec, encoding = spec_from_pb(request.spec), encoding_from_pb(request.encoding)
            limit = self.store.config.max_blocks_per_put
            if len(hashes) > limit:
                raise InvalidArgument(f"Get of {len(hashes)} blocks: at most {limit} per call")
            sent = 0
            try:
                await self.thread.run(self.store.require, spec, hashes)
                for start in range(0, len(hashes), GET_CHUNK_BLOCKS):
                    for frame, nbytes in await self.thread.run(self._read_chunk, spec, hashes[start : start + GET_CHUNK_BLOCKS],
                                                               encoding):
                        sent += nbytes
                        yield frame  # NOTE: serialized already: the server's serializers pass bytes through
            finally:
                span.set_attribute("bytes", sent)
                await self.after_change()

    async def Put(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> kvstore_pb2.PutResponse:
        """open → `block`, `blocks` or `runs` messages → commit, each as its bytes (RAW_REQUESTS).
        Block messages are parsed and staged on the store thread STAGE_BYTES at a time (a 4 MiB
        message's parse is a copy, and each read of a payload one more); the rest, the commit and
        the events it makes take one trip."""
        with traced("kvstore.put") as span:
            put_id, committed, staged, staged_bytes = "", False, [], 0
            try:
                async for frame in request_iterator:
                    kind = put_kind(frame)
                    if not put_id:
                        if kind != "open":
                            raise InvalidArgument("a Put stream must start with an `open` message")
                        message = parse_put(frame, kind)
                        put_id = await self.thread.run(
                            self.store.open_put, spec_from_pb(message.open.spec), message.open.producer_id,
                            message.open.parent_hash or None,
                        )
                    elif kind == "block" or kind == "blocks" or kind == "runs":
                        # NOTE: staged in bulk: one store-thread trip per block (or per message) cost more
                        # than the blocks' own work on small models (a turn's hand-back is ~10 blocks).
                        staged.append((frame, kind))
                        staged_bytes += len(frame)
                        if staged_bytes >= STAGE_BYTES:
                            staged, staged_bytes = await self.thread.run(self._stage, put_id, staged), 0
                    elif kind == "commit":
                        num_blocks = parse_put(frame, kind).commit.num_blocks
                        result = await self.thread.run(self._settled, self._commit, put_id, staged, num_blocks)
                        committed = True
                        span.set_attributes({"stored": result.stored, "duplicates": result.duplicates})
                        return kvstore_pb2.PutResponse(stored=result.stored, duplicates=result.duplicates)
                    else:
                        raise InvalidArgument(f"unexpected {'empty' if not frame else 'unknown'} message in a Put stream")
                if staged:  # NOTE: a block's own error (a reclaimed put, a bad block) comes first
                    await self.thread.run(self._stage, put_id, staged)
                raise InvalidArgument("the Put stream ended without a commit; nothing was stored")
            except MeshError as exc:
                self.metrics.rejected.labels(_reason(exc)).inc()
                raise
            finally:
                if put_id and not committed:
                    await self.thread.run(self.store.abort, put_id)
                await self.feed.publish()

    def _stage(self, put_id: str, staged: list[tuple[bytes, str]]) -> list:
        """Store thread: parses the staged block messages and stages their blocks, runs' blocks and
        chain starts in order (the first bad one aborts the put); [] after."""
        for frame, kind in staged:
            for item in _received(frame, kind):
                if isinstance(item, ChainStart):
                    self.store.start_chain(put_id, item.parent_hash or None)
                elif isinstance(item, kvstore_pb2.KvBlockRun):
                    self.store.stage_run(put_id, encoding_from_pb(item.encoding), item.block_hashes, item.checksums,
                                         item.first_index, item.data, item.scales)
                else:
                    self.store.stage(put_id, block_from_pb(item))
        return []

    def _commit(self, put_id: str, blocks: list[tuple[bytes, str]], num_blocks: int) -> PutResult:
        """Store thread: stages the last `blocks` and commits the put."""
        self._stage(put_id, blocks)
        return self.store.commit(put_id, num_blocks)

    async def Stats(self, request: kvstore_pb2.StatsRequest, context: grpc.aio.ServicerContext) -> kvstore_pb2.StatsResponse:
        c = self.store.counters
        tiers = [
            kvstore_pb2.TierStats(name=t.name, blocks=t.blocks, bytes=t.bytes, capacity_bytes=t.capacity_bytes,
                                  evictions=sum(t.evictions.values()))
            for t in await self.thread.run(self.store.stats)
        ]
        return kvstore_pb2.StatsResponse(
            tiers=tiers, lookups=c.lookups, lookup_hit_blocks=c.lookup_hit_blocks,
            lookup_query_blocks=c.lookup_query_blocks, puts=c.puts, gets=c.gets, lookup_calls=c.lookup_calls,
        )


def _reason(exc: MeshError) -> str:
    if isinstance(exc, ResourceExhausted):
        return "full"
    if isinstance(exc, FailedPrecondition):
        return "expired"
    return "invalid"
