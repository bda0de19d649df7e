"""Checks a recorded KV store Put (a decode worker's hand-back of a finished turn)."""

from __future__ import annotations

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import kvstore_pb2

from . import kvlayout
from .clauses import expect


async def check_handback(puts: list[list[kvstore_pb2.PutMessage]], tokens: list[int], block_size: int) -> None:
    """One of `puts` holds the turn `tokens`: open (spec, producer) → blocks 0.. with the chained
    hashes of `tokens` under the open's spec, valid headers → commit of exactly that many."""
    for frames in puts:
        kinds = [f.WhichOneof("msg") for f in frames]
        expect(kinds and kinds[0] == "open" and kinds[-1] == "commit" and set(kinds[1:-1]) <= {"block"},
               f"a Put stream must be open, block..., commit; got {kinds[:3]}...{kinds[-1:]}")
        spec = frames[0].open.spec
        expect(spec.model_id and spec.num_layers and spec.head_dim, "PutOpen.spec is incomplete")
        expect(frames[0].open.producer_id, "PutOpen.producer_id is empty")
        expect(spec.block_size == block_size, f"PutOpen.spec.block_size {spec.block_size}, the mesh uses {block_size}")
        blocks = [f.block for f in frames[1:-1]]
        expect(frames[-1].commit.num_blocks == len(blocks), f"commit says {frames[-1].commit.num_blocks}, sent {len(blocks)}")
        for i, block in enumerate(blocks):
            problem = kvlayout.header_problem(block, spec, block.header.encoding)
            expect(not problem, problem)
            expect(block.header.num_tokens == spec.block_size, f"hand-back block {i} is partial")
        want = BlockHasher(spec.model_id, spec.dtype, spec.block_size).hashes(tokens)
        got = [b.header.block_hash for b in blocks]
        if got and got[0] == want[0]:
            expect(got == want[: len(got)], "hand-back block hashes are not the chain over prompt + output")
            expect([b.header.block_index for b in blocks] == list(range(len(blocks))), "block_index not 0, 1, ...")
            return
    expect(False, f"none of {len(puts)} hand-back Puts holds the suite's turn (first block hash mismatch: "
                  "block hashes differ from docs/contracts.md?)")
