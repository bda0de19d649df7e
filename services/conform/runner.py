"""Runs one role's clauses against an endpoint and prints one line per clause; and the
`kvmesh conform` command."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from .clauses import ROLES, ClauseFailed, Outcome, Result, Skipped

CONTRACTS = "docs/contracts.md"


@dataclass(slots=True)
class Options:
    """What a suite needs to know besides the endpoint; see `kvmesh conform --help`."""

    role: str
    endpoint: str
    nats: str = ""
    scheduler_port: int = 0     # gateway, canary: the fake scheduler listens here
    kvstore_port: int = 0       # decode: the fake KV store listens here
    model: str = ""             # served model name (default: learnt from the implementation)
    dtype: str = "float32"      # mesh dtype, for block hashes
    block_size: int = 16
    drain_pid: int = 0          # SIGTERM this process for the drain clause (last)
    store_bytes: int = 0        # kvstore: bytes it holds in all (the lease clause fills it)
    kv_spec: str = ""           # decode: "MODEL_ID,DTYPE,LAYERS,KV_HEADS,HEAD_DIM" (else learnt from a hand-back)
    only: tuple[str, ...] = ()
    clause_timeout_s: float = 60.0


async def run(opts: Options, emit: Callable[[str], None] = print) -> list[Result]:
    """Every clause of `opts.role` in order; a clause that raises anything but Skipped fails."""
    module = importlib.import_module(f"kvmesh.conform.{opts.role}")
    ctx = await module.open_session(opts)
    results: list[Result] = []
    try:
        for clause in module.REGISTRY.clauses:
            if opts.only and clause.id not in opts.only:
                continue
            result = await _run_one(clause, ctx, opts.clause_timeout_s)
            results.append(result)
            emit(result.line())
    finally:
        await ctx.close()
    return results


async def _run_one(clause, ctx, timeout_s: float) -> Result:  # noqa: ANN001
    try:
        await asyncio.wait_for(clause.check(ctx), timeout_s)
    except Skipped as exc:
        return Result(clause, Outcome.SKIP, str(exc))
    except ClauseFailed as exc:
        return Result(clause, Outcome.FAIL, str(exc))
    except TimeoutError:
        return Result(clause, Outcome.FAIL, f"no outcome within {timeout_s:g}s")
    except grpc.aio.AioRpcError as exc:
        return Result(clause, Outcome.FAIL, f"unexpected {exc.code().name}: {exc.details()}")
    except Exception as exc:  # noqa: BLE001 - an implementation's surprise is a failure, reported
        return Result(clause, Outcome.FAIL, f"{type(exc).__name__}: {exc}")
    return Result(clause, Outcome.PASS)


def parse(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="kvmesh conform",
        description=f"Check a running implementation of a role against {CONTRACTS}; exits 1 on any failure.")
    p.add_argument("role", choices=ROLES)
    p.add_argument("endpoint", help="gRPC host:port (gateway: its http:// URL)")
    p.add_argument("--nats", default="", help="NATS URL the implementation uses (heartbeat, KV event and mirror clauses)")
    p.add_argument("--scheduler-port", type=int, default=0,
                   help="gateway/canary: port the fake scheduler listens on (start the implementation with "
                        "--scheduler 127.0.0.1:PORT)")
    p.add_argument("--kvstore-port", type=int, default=0,
                   help="decode: port a recording fake KV store listens on (start the worker with --kvstore 127.0.0.1:PORT)")
    p.add_argument("--model", default="", help="served model name (default: from /v1/models or the heartbeat)")
    p.add_argument("--dtype", default="float32", help="mesh dtype, for block hashes")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--drain-pid", type=int, default=0, help="send SIGTERM to this pid to check draining (runs last)")
    p.add_argument("--store-bytes", type=int, default=0,
                   help="kvstore: its capacity in bytes (memory + disk), for the lease clause K17, which fills it")
    p.add_argument("--kv-spec", default="", metavar="MODEL_ID,DTYPE,LAYERS,KV_HEADS,HEAD_DIM",
                   help="decode: the worker's ModelSpec for the PushKv clause D22 (default: learnt from its hand-back)")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="run only these clause ids (repeatable)")
    p.add_argument("--clause-timeout", type=float, default=60.0, help="seconds one clause may take")
    a = p.parse_args(argv)
    return Options(a.role, a.endpoint, a.nats, a.scheduler_port, a.kvstore_port, a.model, a.dtype, a.block_size,
                   a.drain_pid, a.store_bytes, a.kv_spec, tuple(a.only), a.clause_timeout)


def conform_main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    opts = parse(argv)
    results = asyncio.run(run(opts))
    counts = {o: sum(r.outcome is o for r in results) for o in Outcome}
    print(f"{opts.role}: {counts[Outcome.PASS]} passed, {counts[Outcome.FAIL]} failed, "
          f"{counts[Outcome.SKIP]} skipped ({CONTRACTS})")
    return 1 if counts[Outcome.FAIL] else 0
