"""Dockerfile build step: drops the compiled bytecode (.pyc) that serving never loads from the
packages where it is large and almost all unused: transformers (xgrammar imports a sliver of it; the
rest is its model zoo), sympy, networkx and mpmath (torch imports them only for compilation and
symbolic shapes, which kvmesh does not use). About 110 MB of a 1.14 GB image.

What stays is the bytecode of every module these packages load when all of kvmesh is imported
(every service's code path at start, the engine and structured outputs included). Should a
service import one of the others after all, Python compiles it in memory: slower once, never wrong.

    python deploy/docker/slim_bytecode.py SITE_PACKAGES
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

PACKAGES = ("transformers", "sympy", "networkx", "mpmath")


def import_kvmesh() -> None:
    import kvmesh  # noqa: PLC0415

    for module in pkgutil.walk_packages(kvmesh.__path__, "kvmesh."):
        if module.name.endswith(".__main__"):  # runs a command when imported
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            # NOTE: the Triton kernels (and what imports them) load only with a CUDA torch, which
            # keeps triton; on a CPU image their import fails here as it does at run time.
            if exc.name != "triton":
                raise


def main(site: Path) -> None:
    import_kvmesh()
    cached = (getattr(m, "__dict__", {}).get("__cached__") for m in list(sys.modules.values()))
    loaded = {Path(c) for c in cached if isinstance(c, str)}
    dropped = kept = 0
    for package in PACKAGES:
        for pyc in (site / package).rglob("__pycache__/*.pyc"):
            if pyc in loaded:
                kept += pyc.stat().st_size
            else:
                dropped += pyc.stat().st_size
                pyc.unlink()
    print(f"slim_bytecode: dropped {dropped / 1e6:.0f} MB of .pyc in {', '.join(PACKAGES)}; kept {kept / 1e6:.0f} MB that serving loads")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
