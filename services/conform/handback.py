"""Checks recorded KV store Puts (a decode worker's hand-back of finished turns)."""

from __future__ import annotations

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import kvstore_pb2

from . import kvlayout
from .clauses import expect


async def check_handback(puts: list[list[kvstore_pb2.PutMessage]], turns: list[list[int]], block_size: int) -> None:
    """Every Put is open (spec, producer) → blocks → commit of exactly that many, with valid
    headers; and one of them holds blocks of one of `turns` (prompt + output token ids): the
    chained hashes of that turn under the open's spec, from block_index `k` on (`k` > 0 when the
    store already held the first blocks: then parent_hash is block k-1's hash)."""
    matched = False
    for frames in puts:
        kinds = [f.WhichOneof("msg") for f in frames]
        expect(kinds and kinds[0] == "open" and kinds[-1] == "commit" and set(kinds[1:-1]) <= {"block"},
               f"a Put stream must be open, block..., commit; got {kinds[:3]}...{kinds[-1:]}")
        spec, opened = frames[0].open.spec, frames[0].open
        expect(spec.model_id and spec.num_layers and spec.head_dim, "PutOpen.spec is incomplete")
        expect(opened.producer_id, "PutOpen.producer_id is empty")
        expect(spec.block_size == block_size, f"PutOpen.spec.block_size {spec.block_size}, the mesh uses {block_size}")
        blocks = [f.block for f in frames[1:-1]]
        expect(frames[-1].commit.num_blocks == len(blocks), f"commit says {frames[-1].commit.num_blocks}, sent {len(blocks)}")
        for block in blocks:
            problem = kvlayout.header_problem(block, spec, block.header.encoding)
            expect(not problem, problem)
            expect(block.header.num_tokens == spec.block_size, f"hand-back block {block.header.block_index} is partial")
        if not blocks:
            continue
        start = blocks[0].header.block_index
        expect([b.header.block_index for b in blocks] == list(range(start, start + len(blocks))), "block_index not consecutive")
        hasher = BlockHasher(spec.model_id, spec.dtype, spec.block_size)
        sent = [b.header.block_hash for b in blocks]
        # NOTE: turns may share a prefix (one prompt, several samplings): the Put must be the chain
        # of one of them, not necessarily of the first whose first block agrees.
        chains = [want for want in map(hasher.hashes, turns) if len(want) > start and want[start] == sent[0]]
        whole = [want for want in chains if want[start : start + len(blocks)] == sent]
        expect(whole or not chains, "hand-back block hashes are not the chain over prompt + output")
        for want in whole[:1]:
            expect(opened.parent_hash == (want[start - 1] if start else b""), "PutOpen.parent_hash is not block k-1's hash")
            matched = True
    expect(matched, f"none of {len(puts)} hand-back Puts holds blocks of a turn the suite ran "
                    "(block hashes differ from docs/contracts.md?)")
