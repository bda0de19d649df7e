"""The decode worker's engine commands (`kvmesh.worker.commands`): each runs where the engine
runs, on its thread or in its process, with arguments `kvmesh.worker.enginewire` can carry."""

from __future__ import annotations

from typing import Any

import torch

from kvmesh.engine.sampling import SamplingParams
from kvmesh.worker.commands import BASE_COMMANDS, Command

from .receive import fill_prefix

REMOTE, LOCAL, EVICTED = "remote", "local", "evicted"  # how `add_prefilled` got the prompt's KV


def add_prefilled(
    engine: Any, engine_id: str, prompt: list[int], params: SamplingParams, detokenize: bool,
    kv: torch.Tensor | None, start_block: int,
) -> str:
    """Adds the request with the pushed KV `kv` (`[2, L, len(prompt) - 1, H, D]`, blocks from
    `start_block` on received, the head still to fill from this engine's prefix cache), or to
    prefill locally when `kv` is None. REMOTE, LOCAL, or EVICTED when the cached head was evicted
    meanwhile (then it prefills locally too)."""
    how = LOCAL
    if kv is not None:
        local = engine.export_cached_blocks(prompt[: start_block * engine.block_size])
        if len(local) >= start_block:
            kv, how = fill_prefix(kv, local[:start_block]), REMOTE
        else:
            kv, how = None, EVICTED
    engine.add_request(engine_id, prompt, params, computed_kv=kv, detokenize=detokenize)
    return how


def precompile_grammar(engine: Any, kind: str, spec: str) -> None:
    """Compiles a structured-output grammar ahead (from any thread); ValueError when it is bad."""
    engine.constraints.precompile(kind, spec)


def pin_turns(engine: Any, turns: list[list]) -> list[list[int]]:
    """Pins each turn's (`[tokens, held]`) cached blocks after its `held` ones; all or none."""
    pinned: list[list[int]] = []
    try:
        for tokens, held in turns:
            pinned.append(engine.pin_cached_blocks(tokens, held))
    except Exception:
        unpin_turns(engine, pinned)
        raise
    return pinned


def unpin_turns(engine: Any, pinned: list[list[int]]) -> None:
    for ids in pinned:
        engine.unpin_blocks(ids)


def read_turns(engine: Any, pinned: list[list[int]]) -> list:
    """Every turn's pinned blocks' KV, in order, as ONE tensor `[n, 2, L, block_size, H, D]` (CPU;
    one blob across to the worker) and each turn's count of blocks in it: one gather and one copy
    (on CUDA one device-to-host copy, one sync) for the whole batch, not one a turn (~20 µs of
    torch calls a turn on CPU for the gather and its send, 32 turns a batch); safe beside a step."""
    return [engine.read_blocks([i for ids in pinned for i in ids]), [len(ids) for ids in pinned]]


def import_by_hash(engine: Any, hashes: list[bytes], blocks: list[torch.Tensor], start_block: int) -> int:
    """Caches `blocks` (each [2, L, block_size, Hkv, D]) as blocks `start_block..` of the prefix
    `hashes`, tokens unknown (a pre-warm). Returns how many are now cached (stored now or already
    there), stopping at the first that finds no evictable block."""
    manager, cached = engine.block_manager, 0
    for i, kv in enumerate(blocks):
        index = start_block + i
        if not manager.is_cached(hashes[index]):
            block_id = manager.import_block(hashes[index], None, hashes[index - 1] if index else None)
            if block_id is None:
                break
            engine.runner.write_block(block_id, kv)
        cached += 1
    return cached


COMMANDS: dict[str, Command] = {
    **BASE_COMMANDS,
    "add_prefilled": add_prefilled,
    "precompile_grammar": precompile_grammar,
    "pin_turns": pin_turns,
    "unpin_turns": unpin_turns,
    "read_turns": read_turns,
    "import_by_hash": import_by_hash,
}
