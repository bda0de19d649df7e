"""The KV store's request messages, built from plain data (no grpc calls): a Put stream's
messages for whole chains, LookupChains requests within the store's limit, and the chains a Put
to one shard carries. `kvshardclient.py` sends them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .pb import common_pb2, kvstore_pb2

PUT_MESSAGE_BYTES = 4 * 1024 * 1024  # block bytes per Put message (a larger block travels alone)
LOOKUP_CHAINS_HASHES = 65_536  # hashes per LookupChains call: the most a store takes (contracts.md, K19)


@dataclass(slots=True)
class Chain:
    """Consecutive blocks of one sequence; `parent_hash` is the block before the first (empty: none)."""

    blocks: list[common_pb2.KvBlock]
    parent_hash: bytes = b""



def put_messages(spec: common_pb2.ModelSpec, producer_id: str, chains: Sequence[Chain],
                 max_bytes: int = PUT_MESSAGE_BYTES) -> list[kvstore_pb2.PutMessage]:
    """One Put stream: open (with the first chain's parent), each chain's blocks in `blocks`
    messages of at most `max_bytes` block bytes (a larger block travels alone; a later chain's
    first message has `new_chain`), then a commit of them all."""
    opened = kvstore_pb2.PutOpen(spec=spec, producer_id=producer_id, parent_hash=chains[0].parent_hash if chains else b"")
    messages = [kvstore_pb2.PutMessage(open=opened)]
    for n, chain in enumerate(chains):
        batch = kvstore_pb2.KvBlockBatch(new_chain=n > 0, parent_hash=chain.parent_hash if n > 0 else b"")
        size = 0
        for block in chain.blocks:
            nbytes = block.header.byte_length + block.header.scales_length
            if batch.blocks and size + nbytes > max_bytes:
                messages.append(kvstore_pb2.PutMessage(blocks=batch))
                batch, size = kvstore_pb2.KvBlockBatch(), 0
            batch.blocks.append(block)
            size += nbytes
        if batch.blocks:
            messages.append(kvstore_pb2.PutMessage(blocks=batch))
    total = sum(len(c.blocks) for c in chains)
    messages.append(kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=total)))
    return messages


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
    runs: list[Chain] = []
    last = -2
    for i in positions:
        if i == last + 1:
            runs[-1].blocks.append(chain.blocks[i])
        else:
            runs.append(Chain([chain.blocks[i]], chain.blocks[i - 1].header.block_hash if i else chain.parent_hash))
        last = i
    return runs


def renumbered(blocks: list[common_pb2.KvBlock]) -> list[common_pb2.KvBlock]:
    """Copies numbered 0.. (hot blocks replicated from anywhere: their parents are not known)."""
    copies = []
    for i, block in enumerate(blocks):
        copy = common_pb2.KvBlock()
        copy.CopyFrom(block)
        copy.header.block_index = i
        copies.append(copy)
    return copies
