"""Small specs, blocks and a controllable clock for the KV store tests."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvmesh.kvstore.blocks import Block, ModelSpec, make_block

from ..fakeclock import FakeClock

# 2 x 2 layers x 4 tokens x 2 heads x 4 dims = 128 float32 values = 512 bytes per block
SPEC = ModelSpec("m", "float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=4)
BLOCK_BYTES = SPEC.raw_block_bytes



def h(name: str) -> bytes:
    """A 32-byte block hash named for readability."""
    return hashlib.sha256(name.encode()).digest()


def payload(name: str, spec: ModelSpec = SPEC) -> bytes:
    seed = int.from_bytes(h(name)[:4], "little")
    values = np.random.default_rng(seed).standard_normal(spec.numel).astype(np.float32)
    if spec.dtype == "float32":
        return values.astype("<f4").tobytes()
    if spec.dtype == "float16":
        return values.astype("<f2").tobytes()
    return (values.view(np.uint32) >> 16).astype("<u2").tobytes()


def block(name: str, index: int = 0, spec: ModelSpec = SPEC) -> Block:
    return make_block(spec, h(name), index, payload(name, spec))


def chain(*names: str, start: int = 0, spec: ModelSpec = SPEC) -> list[Block]:
    return [block(n, start + i, spec) for i, n in enumerate(names)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
