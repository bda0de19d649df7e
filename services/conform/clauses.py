"""Clauses: one numbered rule of docs/contracts.md, one async check, one result line."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

ROLES = ("gateway", "scheduler", "prefill", "decode", "kvstore", "canary")


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class ClauseFailed(Exception):
    """The implementation broke the clause; the message says how."""


class Skipped(Exception):
    """The clause cannot be checked here (the message says why): never a hidden failure."""


@dataclass(frozen=True, slots=True)
class Clause:
    id: str            # "D3": role letter + number, the anchor in docs/contracts.md
    role: str
    title: str
    check: Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Result:
    clause: Clause
    outcome: Outcome
    detail: str = ""

    def line(self) -> str:
        tail = f": {self.detail}" if self.detail else ""
        return f"{self.outcome.value.upper():4} {self.clause.id:4} {self.clause.title}{tail}"


class Registry:
    """Clauses of one role in the order they run (later ones may use what earlier ones learnt)."""

    def __init__(self, role: str, letter: str) -> None:
        self.role = role
        self.letter = letter
        self.clauses: list[Clause] = []

    def clause(self, number: int, title: str) -> Callable:
        def register(fn: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
            cid = f"{self.letter}{number}"
            if any(c.id == cid for c in self.clauses):
                raise ValueError(f"clause {cid} defined twice")
            self.clauses.append(Clause(cid, self.role, title, fn))
            return fn

        return register


def expect(condition: object, message: str) -> None:
    """Fails the running clause with `message` unless `condition` holds."""
    if not condition:
        raise ClauseFailed(message)


async def expect_status(call: Awaitable[Any], *codes: grpc.StatusCode, what: str) -> grpc.aio.AioRpcError:
    """Awaits a call that must fail with one of `codes`; returns the error."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        if exc.code() in codes:
            return exc
        names = "/".join(c.name for c in codes)
        raise ClauseFailed(f"{what}: got {exc.code().name} ({exc.details()}), expected {names}") from None
    raise ClauseFailed(f"{what}: succeeded, expected {'/'.join(c.name for c in codes)}")


async def collect_stream(call: Any) -> list[Any]:
    """All messages of a server stream, in order."""
    return [msg async for msg in call]
