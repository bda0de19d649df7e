"""docs/contracts.md and the suites agree: every clause a suite runs is written down under its
id, nothing written is unchecked; the fixed block-hash vector is what runtime.blockhash computes;
the suites import no service package."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from kvmesh.conform.clauses import ROLES
from kvmesh.runtime.blockhash import BlockHasher

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "contracts.md").read_text()


def test_every_clause_is_documented_once_and_nothing_else() -> None:
    ids = [c.id for role in ROLES for c in importlib.import_module(f"kvmesh.conform.{role}").REGISTRY.clauses]
    documented = re.findall(r"^- \*\*([GSPDKC]\d+)\*\*", DOC, flags=re.M)
    assert sorted(documented) == sorted(ids)
    assert len(set(documented)) == len(documented)


def test_fixed_block_hash_vector() -> None:
    hasher = BlockHasher("conform-model", "float32", 16)
    hashes = hasher.hashes(list(range(32)))
    for name, value in (("root", hasher.root), ("hash_0", hashes[0]), ("hash_1", hashes[1])):
        assert re.search(rf"^{name}\s+{value.hex()}$", DOC, flags=re.M), name


def test_suites_import_only_the_runtime() -> None:
    allowed = ("kvmesh.runtime", "kvmesh.conform")
    for path in (ROOT / "services" / "conform").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kvmesh"):
                assert node.module.startswith(allowed), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("kvmesh") or alias.name.startswith(allowed), f"{path.name}: {alias.name}"
