"""Builders shared by the scheduler tests."""

from __future__ import annotations

from kvmesh.scheduler.index import BlockIndex, EventBatch, Stored
from kvmesh.scheduler.policy import CostModel, RequestView, RoutingState, WorkerView
from kvmesh.scheduler.registry import HeartbeatInfo, Role

from ..fakeclock import FakeClock  # noqa: F401 - re-exported for the scheduler tests



def hashes(prefix: str, n: int) -> tuple[bytes, ...]:
    """n distinct block hashes of one 'prompt' named by prefix."""
    return tuple(f"{prefix}-{i}".encode() for i in range(n))


def hb(worker_id: str, role: Role = Role.DECODE, **fields) -> HeartbeatInfo:
    defaults = {"endpoint": f"127.0.0.1:{abs(hash(worker_id)) % 50000 + 1000}", "max_num_seqs": 8, "started_at": 1.0}
    return HeartbeatInfo(worker_id=worker_id, role=role, **{**defaults, **fields})


def stored_batch(worker_id: str, seq: int, blocks: tuple[bytes, ...]) -> EventBatch:
    return EventBatch(worker_id, seq, (Stored(blocks),))


def state(num_prompt_tokens: int, blocks: tuple[bytes, ...], *workers: WorkerView, block_size: int = 16) -> RoutingState:
    cost = CostModel(prefill_s_per_token=1e-4, decode_s_per_step=0.01, decode_s_per_seq=0.0, block_size=block_size)
    return RoutingState(RequestView("r1", num_prompt_tokens, blocks), tuple(workers), cost)


def index_with(*entries: tuple[str, tuple[bytes, ...]]) -> BlockIndex:
    index = BlockIndex()
    for worker_id, blocks in entries:
        index.apply(stored_batch(worker_id, index.last_seq(worker_id) + 1, blocks))
    return index
