"""Checks recorded KV store Puts (a decode worker's hand-back of finished turns)."""

from __future__ import annotations

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.kvstoremsgs import BlockRun
from kvmesh.runtime.pb import kvstore_pb2

from . import kvlayout
from .clauses import ClauseFailed, expect


def chains_of(frames: list[kvstore_pb2.PutMessage]) -> list[tuple[bytes, list]]:
    """A Put stream's chains as (parent_hash, blocks): the open's parent and the blocks that follow
    (`block` messages, `blocks` batches, or the runs of `runs` messages, as the KvBlocks they
    pack), then one more per batch or run with `new_chain`."""
    chains: list[tuple[bytes, list]] = [(frames[0].open.parent_hash, [])]
    for frame in frames[1:-1]:
        kind = frame.WhichOneof("msg")
        if kind == "block":
            chains[-1][1].append(frame.block)
            continue
        groups = [(run, _unpacked(run, frames[0].open.spec)) for run in frame.runs.runs] if kind == "runs" else \
            [(frame.blocks, list(frame.blocks.blocks))]
        for group, blocks in groups:
            if group.new_chain:
                chains.append((group.parent_hash, blocks))
            else:
                chains[-1][1].extend(blocks)
    return [(parent, blocks) for parent, blocks in chains if blocks]


def _unpacked(run: kvstore_pb2.KvBlockRun, spec) -> list:  # noqa: ANN001 - a ModelSpec message
    """A run's blocks as KvBlocks carrying the run's own checksums (so `_check_chain` checks them
    against the data); a run that does not split evenly, or whose checksums are not one a block,
    fails the clause."""
    n = len(run.block_hashes)
    if n == 0 or len(run.checksums) != n or len(run.data) % n or len(run.scales) % n:
        raise ClauseFailed(f"a hand-back run of {n} blocks has {len(run.checksums)} checksums, {len(run.data)} data and "
                           f"{len(run.scales)} scale bytes")
    return BlockRun(list(run.block_hashes), list(run.checksums), run.first_index, run.encoding, run.data,
                    run.scales).as_blocks(spec)


async def check_handback(puts: list[list[kvstore_pb2.PutMessage]], turns: list[list[int]], block_size: int) -> None:
    """Every Put is open (spec, producer) → blocks (`block`, `blocks` or `runs` messages) → commit of
    exactly that many, with valid headers; and one of them holds blocks of one of `turns`
    (prompt + output token ids): a chain of the Put (the open's, or one a `blocks` message with
    `new_chain` starts) has the chained hashes of that turn under the open's spec, from
    block_index `k` on (`k` > 0 when the store already held the first blocks: then the chain's
    parent_hash is block k-1's hash)."""
    matched = False
    for frames in puts:
        kinds = [f.WhichOneof("msg") for f in frames]
        expect(kinds and kinds[0] == "open" and kinds[-1] == "commit" and set(kinds[1:-1]) <= {"block", "blocks", "runs"},
               f"a Put stream must be open, block, blocks or runs..., commit; got {kinds[:3]}...{kinds[-1:]}")
        spec, opened = frames[0].open.spec, frames[0].open
        expect(spec.model_id and spec.num_layers and spec.head_dim, "PutOpen.spec is incomplete")
        expect(opened.producer_id, "PutOpen.producer_id is empty")
        expect(spec.block_size == block_size, f"PutOpen.spec.block_size {spec.block_size}, the mesh uses {block_size}")
        chains = chains_of(frames)
        sent_count = sum(len(blocks) for _, blocks in chains)
        expect(frames[-1].commit.num_blocks == sent_count, f"commit says {frames[-1].commit.num_blocks}, sent {sent_count}")
        hasher = BlockHasher(spec.model_id, spec.dtype, spec.block_size)
        wanted = [hasher.hashes(turn) for turn in turns]
        for parent, blocks in chains:
            matched = _check_chain(parent, blocks, spec, wanted) or matched
    expect(matched, f"none of {len(puts)} hand-back Puts holds blocks of a turn the suite ran "
                    "(block hashes differ from docs/contracts.md?)")


def _check_chain(parent: bytes, blocks: list, spec, wanted: list[list[bytes]]) -> bool:  # noqa: ANN001
    """Checks one chain of a Put; True when it is (part of) one of the `wanted` hash chains."""
    for block in blocks:
        problem = kvlayout.header_problem(block, spec, block.header.encoding)
        expect(not problem, problem)
        expect(block.header.num_tokens == spec.block_size, f"hand-back block {block.header.block_index} is partial")
    start = blocks[0].header.block_index
    expect([b.header.block_index for b in blocks] == list(range(start, start + len(blocks))), "block_index not consecutive")
    sent = [b.header.block_hash for b in blocks]
    # NOTE: turns may share a prefix (one prompt, several samplings): the chain must be the one of
    # one of them, not necessarily of the first whose first block agrees.
    chains = [want for want in wanted if len(want) > start and want[start] == sent[0]]
    whole = [want for want in chains if want[start : start + len(blocks)] == sent]
    expect(whole or not chains, "hand-back block hashes are not the chain over prompt + output")
    for want in whole[:1]:
        expect(parent == (want[start - 1] if start else b""), "the chain's parent_hash is not block k-1's hash")
        return True
    return False
