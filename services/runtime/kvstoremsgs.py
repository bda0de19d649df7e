"""The KV store's request messages, built from plain data (no grpc calls): a Put stream's
messages for whole chains, LookupChains requests within the store's limit, and the chains a Put
to one shard carries. `kvshardclient.py` sends them.

A chain's blocks are `KvBlock` messages, or one `BlockRun`: consecutive full blocks in one payload
(`KvBlockRun` on the wire). A decode worker hands a turn back as a run: one bytes object, a crc32
per block, and one message, where a `KvBlock` per block cost the worker and the store ~50 µs of
Python a block (README, "The token path")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import kvwire, pbframe
from .pb import common_pb2, kvstore_pb2

PUT_MESSAGE_BYTES = 4 * 1024 * 1024  # block bytes per Put message (a larger block travels alone)
LOOKUP_CHAINS_HASHES = 65_536  # hashes per LookupChains call: the most a store takes (contracts.md, K19)


@dataclass(slots=True)
class BlockRun:
    """n consecutive full blocks of one sequence in one payload: block i has `block_hashes[i]`,
    index `first_index + i`, checksum `checksums[i]` and the i-th `data` (and `scales`) of
    len(data) / n (len(scales) / n) bytes, in `encoding` (a `KvEncoding` value)."""

    block_hashes: list[bytes]
    checksums: list[int]
    first_index: int
    encoding: int
    data: bytes
    scales: bytes = b""

    @classmethod
    def of(cls, data: bytes, block_hashes: Sequence[bytes], first_index: int, encoding: int = common_pb2.KV_ENCODING_RAW,
           scales: bytes = b"") -> BlockRun:
        """A run of len(block_hashes) blocks cut evenly from `data` (and `scales`), checksums computed."""
        n = len(block_hashes)
        if n == 0 or len(data) % n or len(scales) % n:
            raise ValueError(f"{len(data)} data and {len(scales)} scale bytes do not split into {n} blocks")
        size, scale_size = len(data) // n, len(scales) // n
        view, scale_view = memoryview(data), memoryview(scales)  # NOTE: views: no copy a block for its crc
        checksums = [kvwire.checksum(view[i * size:(i + 1) * size], scale_view[i * scale_size:(i + 1) * scale_size])
                     for i in range(n)]
        return cls(list(block_hashes), checksums, first_index, encoding, data, scales)

    def __len__(self) -> int:
        return len(self.block_hashes)

    def _block_bytes(self) -> tuple[int, int]:
        """(data, scales) bytes of one block."""
        n = len(self.block_hashes)
        return len(self.data) // n, len(self.scales) // n

    @property
    def nbytes(self) -> int:
        return len(self.data) + len(self.scales)

    def part(self, start: int, stop: int) -> BlockRun:
        """Blocks [start, stop) of the run, as a run."""
        size, scale_size = self._block_bytes()
        return BlockRun(self.block_hashes[start:stop], self.checksums[start:stop], self.first_index + start, self.encoding,
                        self.data[start * size:stop * size], self.scales[start * scale_size:stop * scale_size])

    def add_to(self, runs: kvstore_pb2.KvBlockRuns, new_chain: bool = False, parent_hash: bytes = b"") -> None:
        """Appends the run to a `runs` message (built in place: its payload is copied once)."""
        runs.runs.add(**self.head(new_chain, parent_hash), data=self.data, scales=self.scales)

    def head(self, new_chain: bool, parent_hash: bytes) -> dict:
        """Its `KvBlockRun` fields but the payload (data and scales)."""
        return dict(block_hashes=self.block_hashes, checksums=self.checksums, first_index=self.first_index,
                    encoding=self.encoding, new_chain=new_chain, parent_hash=parent_hash)

    def as_blocks(self, spec: common_pb2.ModelSpec) -> list[common_pb2.KvBlock]:
        """The same blocks as `KvBlock`s of `spec` (for a store older than `KvBlockRun`)."""
        size, scale_size = self._block_bytes()
        shape = (2, spec.num_layers, spec.block_size, spec.num_kv_heads, spec.head_dim)
        return [kvwire.block_message(self.data[i * size:(i + 1) * size], self.scales[i * scale_size:(i + 1) * scale_size],
                                     spec.dtype, shape, self.encoding, self.block_hashes[i], self.first_index + i,
                                     crc=self.checksums[i])
                for i in range(len(self))]


@dataclass(slots=True)
class Chain:
    """Consecutive blocks of one sequence (`KvBlock`s, or one `BlockRun`); `parent_hash` is the
    block before the first (empty: none)."""

    blocks: list[common_pb2.KvBlock] | BlockRun
    parent_hash: bytes = b""

    @property
    def hashes(self) -> list[bytes]:
        if isinstance(self.blocks, BlockRun):
            return self.blocks.block_hashes
        return [b.header.block_hash for b in self.blocks]



RunEntry = tuple["BlockRun", bool, bytes]  # a run of a `runs` message: (run, new_chain, parent_hash)
PutItem = kvstore_pb2.PutMessage | list[RunEntry]  # a Put stream's message, or a `runs` message's runs


def put_messages(spec: common_pb2.ModelSpec, producer_id: str, chains: Sequence[Chain],
                 max_bytes: int = PUT_MESSAGE_BYTES, runs_ok: bool = True) -> list[kvstore_pb2.PutMessage]:
    """One Put stream: open (with the first chain's parent), each chain's blocks in `blocks`
    messages (runs in `runs` messages, consecutive ones together) of at most `max_bytes` block
    bytes (a larger block travels alone; a later chain's first message has `new_chain`), then a
    commit of them all. Without `runs_ok` (a store older than `KvBlockRun`) runs go as `blocks` too."""
    return [_runs_message(item) if isinstance(item, list) else item for item in _put_items(spec, producer_id, chains, max_bytes, runs_ok)]


def put_frames(spec: common_pb2.ModelSpec, producer_id: str, chains: Sequence[Chain],
               max_bytes: int = PUT_MESSAGE_BYTES, runs_ok: bool = True) -> list[bytes]:
    """`put_messages`, serialized: what a Put call sends with no serializer of its own.

    NOTE: a `runs` message is written here, its payloads joined in once (`runs_frame`): protobuf's
    serializer took 1.4 ms of CPU for a 2 MiB message in a loop, and 2-30 ms in a decode worker
    (a hand-back batch of 32 turns on `tiny`: ~20 µs a block), where joining the bytes takes ~0.2."""
    return [runs_frame(item) if isinstance(item, list) else item.SerializeToString()
            for item in _put_items(spec, producer_id, chains, max_bytes, runs_ok)]


def _put_items(spec: common_pb2.ModelSpec, producer_id: str, chains: Sequence[Chain], max_bytes: int,
               runs_ok: bool) -> list[PutItem]:
    opened = kvstore_pb2.PutOpen(spec=spec, producer_id=producer_id, parent_hash=chains[0].parent_hash if chains else b"")
    items: list[PutItem] = [kvstore_pb2.PutMessage(open=opened)]
    packed: list[RunEntry] | None = None  # the `runs` message being filled
    packed_bytes = 0
    for n, chain in enumerate(chains):
        if isinstance(chain.blocks, BlockRun):
            if runs_ok:
                for run, new_chain in _run_pieces(chain.blocks, n > 0, max_bytes):
                    if packed is None or packed_bytes + run.nbytes > max_bytes:
                        packed, packed_bytes = [], 0
                        items.append(packed)
                    packed.append((run, new_chain, chain.parent_hash if new_chain else b""))
                    packed_bytes += run.nbytes
                continue
            chain = Chain(chain.blocks.as_blocks(spec), chain.parent_hash)
        packed = None
        batch = kvstore_pb2.KvBlockBatch(new_chain=n > 0, parent_hash=chain.parent_hash if n > 0 else b"")
        size = 0
        for block in chain.blocks:
            nbytes = block.header.byte_length + block.header.scales_length
            if batch.blocks and size + nbytes > max_bytes:
                items.append(kvstore_pb2.PutMessage(blocks=batch))
                batch, size = kvstore_pb2.KvBlockBatch(), 0
            batch.blocks.append(block)
            size += nbytes
        if batch.blocks:
            items.append(kvstore_pb2.PutMessage(blocks=batch))
    total = sum(len(c.blocks) for c in chains)
    items.append(kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=total)))
    return items


def _runs_message(entries: list[RunEntry]) -> kvstore_pb2.PutMessage:
    message = kvstore_pb2.PutMessage()
    for run, new_chain, parent_hash in entries:
        run.add_to(message.runs, new_chain, parent_hash)
    return message


_RUNS_IN_PUT = pbframe.key(5)  # PutMessage.runs
_RUN_IN_RUNS = pbframe.key(1)  # KvBlockRuns.runs
_RUN_DATA = pbframe.key(5)  # KvBlockRun.data
_RUN_SCALES = pbframe.key(6)  # KvBlockRun.scales


def runs_frame(entries: list[RunEntry]) -> bytes:
    """A `PutMessage` of `runs`, serialized (`pbframe`): each run's fields but its payload by
    protobuf, its payload and scales joined in once; a parser reads it as `put_messages`' message."""
    parts: list[pbframe.Buffer] = []
    for run, new_chain, parent_hash in entries:
        head = kvstore_pb2.KvBlockRun(**run.head(new_chain, parent_hash)).SerializeToString()
        parts += pbframe.wrapped(_RUN_IN_RUNS, pbframe.pieces(head, [(_RUN_DATA, run.data), (_RUN_SCALES, run.scales)]))
    return b"".join(pbframe.wrapped(_RUNS_IN_PUT, parts))


def _run_pieces(run: BlockRun, new_chain: bool, max_bytes: int) -> list[tuple[BlockRun, bool]]:
    """`run` in pieces of at most `max_bytes` block bytes (at least one block each), each with
    whether it starts a new chain (the first, when the run does)."""
    per = max(1, max_bytes // max(1, run.nbytes // len(run)))
    if len(run) <= per:
        return [(run, new_chain)]
    return [(run.part(i, i + per), new_chain and i == 0) for i in range(0, len(run), per)]


def lookup_chains_requests(spec: common_pb2.ModelSpec, shares: list[list[bytes]], lease_s: float,
                           max_hashes: int = LOOKUP_CHAINS_HASHES) -> list[kvstore_pb2.LookupChainsRequest]:
    """`shares` as LookupChains requests of at most `max_hashes` hashes each, chains in order (a
    longer chain is asked about its first `max_hashes` blocks: a prefix held is no longer)."""
    requests = [kvstore_pb2.LookupChainsRequest(spec=spec, lease_s=lease_s)]
    size = 0
    for share in shares:
        share = share[:max_hashes]
        if size + len(share) > max_hashes:
            requests.append(kvstore_pb2.LookupChainsRequest(spec=spec, lease_s=lease_s))
            size = 0
        requests[-1].chains.append(kvstore_pb2.HashChain(block_hashes=share))
        size += len(share)
    return requests


def runs(chain: Chain, positions: list[int]) -> list[Chain]:
    """`chain`'s blocks at `positions` (ascending) as chains of contiguous blocks, each with its parent."""
    if isinstance(chain.blocks, BlockRun):
        return _run_parts(chain.blocks, chain.parent_hash, positions)
    runs: list[Chain] = []
    last = -2
    for i in positions:
        if i == last + 1:
            runs[-1].blocks.append(chain.blocks[i])
        else:
            runs.append(Chain([chain.blocks[i]], chain.blocks[i - 1].header.block_hash if i else chain.parent_hash))
        last = i
    return runs


def _run_parts(run: BlockRun, parent_hash: bytes, positions: list[int]) -> list[Chain]:
    """A run's blocks at `positions` (ascending) as chains, one run for each stretch of contiguous ones."""
    if len(positions) == len(run):
        return [Chain(run, parent_hash)]
    parts: list[Chain] = []
    start = last = positions[0] if positions else 0
    for i in [*positions[1:], None]:
        if i is not None and i == last + 1:
            last = i
            continue
        parts.append(Chain(run.part(start, last + 1), run.block_hashes[start - 1] if start else parent_hash))
        if i is not None:
            start = last = i
    return parts if positions else []


def renumbered(blocks: list[common_pb2.KvBlock]) -> list[common_pb2.KvBlock]:
    """Copies numbered 0.. (hot blocks replicated from anywhere: their parents are not known)."""
    copies = []
    for i, block in enumerate(blocks):
        copy = common_pb2.KvBlock()
        copy.CopyFrom(block)
        copy.header.block_index = i
        copies.append(copy)
    return copies
