"""Named engine commands: what a worker may ask of its engine, by name, with plain arguments.

Both engine loops run them: the thread (`worker.EngineLoop`) calls `COMMANDS[name](engine, *args)`
on its thread, the engine process (`engineproc.EngineProcess`) sends the name and the arguments
(`enginewire`) and its host runs the same function there. A closure cannot cross a process, so a
worker that may run its engine in a process asks for everything by name. Each worker role adds
its own commands to these (`kvmesh.decode.commands`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Command = Callable[..., Any]  # (engine, *args) -> a value `enginewire.pack` can carry


def abort_request(engine: Any, request_id: str) -> None:
    engine.abort_request(request_id)


def cached_prefix_blocks(engine: Any, token_ids: list[int]) -> int:
    return engine.cached_prefix_blocks(token_ids)


def has_unfinished_requests(engine: Any) -> bool:
    return engine.has_unfinished_requests()


BASE_COMMANDS: dict[str, Command] = {
    "abort_request": abort_request,
    "cached_prefix_blocks": cached_prefix_blocks,
    "has_unfinished_requests": has_unfinished_requests,
}
