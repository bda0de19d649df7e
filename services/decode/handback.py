"""Handing finished turns to the KV store: best effort, in the background, bounded.

Only the blocks the store lacks leave: each turn's block hashes are looked up first (the leading
run the store holds, under no lease: nobody fetches these blocks) and the rest are pinned in the
engine (one short command between steps), copied beside the step loop (`offload`: one gather of
every turn's blocks, one tensor across) and packed on a worker thread (one `KvBlockRun` a turn:
one payload, a crc32 a block; the batch's runs share one `runs` message) - never on the engine's
step loop - and put with a two-phase `KvStore.Put` per owner shard
(`runtime/kvshardclient.py`; one store is one shard). Turns that wait together are handed back
together: one `LookupChains` per shard asks about all of them (a unary Lookup per turn cost the
store ~0.5-0.9 ms of gRPC each) and their blocks share one pin, one copy and one Put per shard (a
chain per turn), up to `MAX_BATCH_BYTES` of blocks. A batch goes once `batch_turns` turns wait,
once no turn has ended for `window_s`, or `max_window_s` after its first turn: every batch costs
the worker, the store and the scheduler a lookup, a pin, a copy, a Put stream and the store's
events whatever it carries. Turns that end apart but steadily (requests of many lengths,
bench/tokcost.py --vary-tokens) went ~6 to a batch when a batch waited a fixed 50 ms; now ~24 go
together (256 turns in 10-11 Puts) and the store's CPU halved (README, "The token path"). A lone
turn, or a burst that ends together, still goes `window_s` after its last turn (the simulator's
calibration probes rely on that: meshprobe.py's settle_s). A full queue drops the turn before
anything is hashed or copied; a failed put is logged. Neither ever delays or fails a response.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.kvshardclient import NO_LEASE, ShardedStore
from kvmesh.runtime.kvstoremsgs import Chain
from kvmesh.runtime.pb import common_pb2
from kvmesh.runtime.telemetry import tracer
from kvmesh.worker.engineproc import EngineProcess
from kvmesh.worker.worker import EngineLoop

from . import metrics

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = 64 * 1024 * 1024  # block bytes of the turns handed back together (a larger turn goes alone)


@dataclass(slots=True)
class Turn:
    """A finished turn to hand back: its tokens, block hashes and how many the store holds."""

    tokens: list[int]
    hashes: list[bytes]
    held: int = 0

    @property
    def parent_hash(self) -> bytes:
        return self.hashes[self.held - 1] if self.held else b""


class Handback:
    """`offer(tokens)` from the event loop when a turn ends; one task puts turns to the store."""

    def __init__(
        self, store: ShardedStore, spec: common_pb2.ModelSpec, producer_id: str, loop: EngineLoop | EngineProcess, hasher: BlockHasher,
        max_queue: int = 16, window_s: float = 0.05, batch_turns: int = 32, max_window_s: float = 0.25,
    ) -> None:
        self.store = store
        self.spec = spec
        self.producer_id = producer_id
        self.dropped = 0
        self.blocks_stored = 0
        self.blocks_skipped = 0  # already in the store
        self._loop = loop
        self._hasher = hasher
        self._enabled = max_queue > 0  # NOTE: asyncio.Queue(maxsize=0) would be unbounded, not off
        self._queue: asyncio.Queue[list[int]] = asyncio.Queue(maxsize=max(1, max_queue))
        self._task: asyncio.Task | None = None
        self._window_s = window_s
        self._max_window_s = max(window_s, max_window_s)
        self._batch_turns = max(1, batch_turns)
        self._arrived = asyncio.Event()  # set by every offer
        block_bytes = kvwire.expected_lengths(spec, spec.block_size, kvwire.RAW)[0]
        self._max_batch_blocks = max(1, MAX_BATCH_BYTES // max(1, block_bytes))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kv-handback")

    def offer(self, tokens: list[int]) -> bool:
        """Queue a finished turn (prompt + output token ids); False when dropped or too short."""
        if not self._enabled or len(tokens) < self.spec.block_size:
            return False
        try:
            self._queue.put_nowait(tokens)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        self._arrived.set()
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        carry: list[int] | None = None  # a turn taken that did not fit the last batch
        while True:
            batch = [carry if carry is not None else await self._queue.get()]
            await self._gather()
            carry, blocks = None, len(batch[0]) // self.spec.block_size
            while carry is None and not self._queue.empty():
                tokens = self._queue.get_nowait()
                if blocks + len(tokens) // self.spec.block_size > self._max_batch_blocks:
                    carry = tokens
                else:
                    batch.append(tokens)
                    blocks += len(tokens) // self.spec.block_size
            try:
                await self._put(batch)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("KV handback failed: %s", exc)

    async def _gather(self) -> None:
        """Waits for turns to join the batch (the one taken and those queued): until batch_turns
        wait, no turn has ended for window_s, or max_window_s after the batch's first."""
        if self._window_s <= 0:
            return
        clock = asyncio.get_running_loop()
        deadline = clock.time() + self._max_window_s
        while self._queue.qsize() + 1 < self._batch_turns:
            wait = min(self._window_s, deadline - clock.time())
            if wait <= 0:
                return
            self._arrived.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._arrived.wait()
            except TimeoutError:
                return

    async def _put(self, batch: list[list[int]]) -> None:
        turns = [Turn(tokens, self._hasher.hashes(tokens)) for tokens in batch]
        # NOTE: no lease: a lease pinned blocks nobody fetches for 30 s, and a full store then failed Puts
        found = await self.store.lookup_chains([turn.hashes for turn in turns], NO_LEASE)
        for turn, lookup in zip(turns, found):
            turn.held = min(lookup.num_blocks, len(turn.hashes))
            self.blocks_skipped += turn.held
        turns = [turn for turn in turns if turn.held < len(turn.hashes)]
        if not turns:
            return
        pinned = await self._loop.call("pin_turns", [[turn.tokens, turn.held] for turn in turns])
        try:
            kv, counts = await self._loop.offload("read_turns", pinned)
        finally:
            self._loop.call_nowait("unpin_turns", pinned)
        chains = await asyncio.to_thread(self._encode, list(kv.split(counts)), turns)
        chains = [chain for chain in chains if chain.blocks]
        if not chains:
            return
        count = sum(len(chain.blocks) for chain in chains)
        with tracer.start_as_current_span("kvstore.put", attributes={"blocks": count, "turns": len(chains)}) as span:
            stored, duplicates = await self.store.put_chains(self.producer_id, chains)
            span.set_attribute("stored", stored)
            span.set_attribute("duplicates", duplicates)
        self.blocks_stored += count
        metrics.HANDBACK_BLOCKS.inc(count)

    def _encode(self, turn_blocks: list[torch.Tensor], turns: list[Turn]) -> list[Chain]:
        """Worker thread: each turn's blocks (one tensor `[n, 2, L, block_size, H, D]` a turn: the
        engine's pinned blocks after the held ones, which may be fewer than the turn's hashes) as a
        chain: one run (`KvBlockRun`) a turn, not a message a block."""
        return [Chain(kvtensor.pack_blocks(kv, turn.hashes[turn.held:turn.held + kv.shape[0]], turn.held, self.spec.dtype),
                      turn.parent_hash)
                for kv, turn in zip(turn_blocks, turns) if kv.shape[0]]

