"""Two-phase put sessions: blocks are staged, invisible, until commit; abandoned sessions expire.

A put holds one chain of blocks (consecutive `block_index`, the first after the open's parent),
or several: `start_chain(parent)` makes the next block start another one after `parent`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kvmesh.runtime.errors import FailedPrecondition, InvalidArgument

from .blocks import Block, ModelSpec, check_block, check_run_block


@dataclass(slots=True)
class PutSession:
    put_id: str
    spec: ModelSpec
    producer_id: str
    parent: bytes | None
    last_activity: float
    blocks: list[Block] = field(default_factory=list)
    chains: dict[int, bytes | None] = field(default_factory=dict)  # position in `blocks` -> parent of the chain it starts

    @property
    def staged_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)


class PutSessions:
    """Open put sessions; `expire(now)` reclaims those idle for more than `timeout_s`."""

    def __init__(self, timeout_s: float, max_blocks: int) -> None:
        self.timeout_s = timeout_s
        self.max_blocks = max_blocks
        self._open: dict[str, PutSession] = {}
        self._ids = itertools.count(1)
        self.abandoned = 0

    def __len__(self) -> int:
        return len(self._open)

    def open(self, spec: ModelSpec, producer_id: str, parent: bytes | None, now: float) -> PutSession:
        session = PutSession(f"put-{next(self._ids)}", spec, producer_id, parent, now)
        self._open[session.put_id] = session
        return session

    def get(self, put_id: str, now: float) -> PutSession:
        session = self._open.get(put_id)
        if session is None:
            raise FailedPrecondition(f"put {put_id} is unknown, finished or expired (idle > {self.timeout_s:g}s)")
        session.last_activity = now
        return session

    def stage(self, put_id: str, block: Block, now: float) -> None:
        """Validates `block` against the session's spec and order, then stages it (not yet visible)."""
        session = self.get(put_id, now)
        check_block(session.spec, block)
        self._check_next(session, block.header.block_index, 1)
        session.blocks.append(block)

    def stage_run(self, put_id: str, blocks: list[Block], now: float) -> None:
        """Stages a run's blocks as `stage` stages each, checking what the run does not settle.

        NOTE: `blocks_of_run` made their headers from the session's spec and cut their payloads
        at the spec's lengths, so dtype, shape, layers, token count and lengths hold by
        construction and their indices follow each other; each block's hash and checksum are its
        own. The store thread's cost a block: ~11.5 µs staged one at a time, ~10 as a run."""
        session = self.get(put_id, now)
        if not blocks:
            return
        self._check_next(session, blocks[0].header.block_index, len(blocks))
        for block in blocks:
            check_run_block(block)
        session.blocks.extend(blocks)

    def _check_next(self, session: PutSession, first_index: int, count: int) -> None:
        """`count` blocks from `first_index` may be staged next: within the put's block limit, and
        following the last staged block unless they start a chain."""
        if len(session.blocks) + count > self.max_blocks:
            raise InvalidArgument(f"put {session.put_id}: more than {self.max_blocks} blocks in one put")
        starts_chain = len(session.blocks) in session.chains
        if session.blocks and not starts_chain and first_index != session.blocks[-1].header.block_index + 1:
            raise InvalidArgument(
                f"put {session.put_id}: block_index {first_index} does not follow "
                f"{session.blocks[-1].header.block_index} (blocks must come in sequence order)"
            )

    def start_chain(self, put_id: str, parent: bytes | None, now: float) -> None:
        """The next block staged starts another chain, after `parent` (None: a first block)."""
        session = self.get(put_id, now)
        if len(session.blocks) == 0:
            session.parent = parent
        else:
            session.chains[len(session.blocks)] = parent

    def close(self, put_id: str) -> PutSession | None:
        return self._open.pop(put_id, None)

    def expire(self, now: float) -> list[str]:
        """Drops sessions idle for longer than the timeout; returns their ids."""
        stale = [pid for pid, s in self._open.items() if now - s.last_activity > self.timeout_s]
        for pid in stale:
            del self._open[pid]
        self.abandoned += len(stale)
        return stale
