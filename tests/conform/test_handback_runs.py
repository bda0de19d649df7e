"""The hand-back clause reads `runs` messages by the layout: a run's own checksums are checked."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from kvmesh.conform.clauses import ClauseFailed
from kvmesh.conform.handback import check_handback
from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.pb import common_pb2, kvstore_pb2

SPEC = common_pb2.ModelSpec(model_id="m", dtype="float32", block_size=4, num_layers=1, num_kv_heads=1, head_dim=2)
TURN = list(range(1, 13))  # three full blocks
BLOCK = 2 * 1 * 4 * 1 * 2 * 4  # bytes of one float32 block of SPEC


def put(checksums=None, data=None) -> list[kvstore_pb2.PutMessage]:
    hashes = BlockHasher(SPEC.model_id, SPEC.dtype, SPEC.block_size).hashes(TURN)
    payload = data if data is not None else bytes(range(3 * BLOCK))
    sums = checksums or [zlib.crc32(payload[i * BLOCK:(i + 1) * BLOCK]) for i in range(3)]
    run = kvstore_pb2.KvBlockRun(block_hashes=hashes, checksums=sums, first_index=0, encoding=common_pb2.KV_ENCODING_RAW,
                                 data=payload)
    return [kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(spec=SPEC, producer_id="w")),
            kvstore_pb2.PutMessage(runs=kvstore_pb2.KvBlockRuns(runs=[run])),
            kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=3))]


def test_a_run_with_right_checksums_passes_and_a_wrong_one_fails_the_clause() -> None:
    asyncio.run(check_handback([put()], [TURN], SPEC.block_size))
    good = put()[1].runs.runs[0].checksums
    with pytest.raises(ClauseFailed, match="checksum"):
        asyncio.run(check_handback([put(checksums=[good[0], good[1] ^ 1, good[2]])], [TURN], SPEC.block_size))


def test_a_run_whose_checksums_or_bytes_do_not_match_its_blocks_fails_the_clause() -> None:
    with pytest.raises(ClauseFailed, match="2 checksums"):
        asyncio.run(check_handback([put(checksums=[1, 2])], [TURN], SPEC.block_size))
    with pytest.raises(ClauseFailed, match="data"):
        asyncio.run(check_handback([put(data=bytes(3 * BLOCK - 1))], [TURN], SPEC.block_size))
