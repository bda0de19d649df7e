"""`kvmesh sim`: the real routing policies against simulated workers (see cluster.py)."""

from __future__ import annotations


def sim_main(argv: list[str] | None = None) -> int:
    from .cli import sim_main as run  # noqa: PLC0415 - keep `import kvmesh.scheduler.sim` light

    return run(argv)


__all__ = ["sim_main"]
