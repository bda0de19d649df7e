"""A bench/ script loaded as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py as a module (the bench scripts import each other, so bench/ is on the path
    while it loads)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # NOTE: a dataclass looks its module up there while the module loads
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))
