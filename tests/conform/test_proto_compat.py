"""Proto compatibility with buf (the @bufbuild/buf npm package, tools/buf/package.json): the protos
lint clean and break nothing against where this branch left main (or the last tag); deliberately breaking edits (the fixtures below) fail,
an added field passes."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("proto_compat", ROOT / "tools" / "proto_compat.py")
proto_compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proto_compat)

# file, text before, text after: each edit alone must be reported as breaking
BREAKING = {
    "renumbered field": ("common.proto", "uint32 max_tokens = 5;", "uint32 max_tokens = 15;"),
    "retyped field": ("decode.proto", "repeated uint32 token_ids = 1;", "repeated uint64 token_ids = 1;"),
    "removed field": ("events.proto", "  uint64 kv_event_seq = 15;         // last KV event sequence number published\n", ""),
    "renamed field": ("scheduler.proto", "repeated string exclude_workers = 8;", "repeated string excluded_workers = 8;"),
    "removed rpc": ("decode.proto", "  rpc Abort(AbortRequest) returns (AbortResponse);\n", ""),
}
ADDITIVE = ("common.proto", "bool ignore_eos = 8;", "bool ignore_eos = 8;\n  uint32 conform_added_field = 99;")


def edited(tmp_path: Path, file: str, before: str, after: str) -> Path:
    """A workspace (buf.yaml + proto/) with one edit applied to proto/kvmesh/v1/`file`."""
    work = tmp_path / "edited"
    shutil.copytree(ROOT / "proto", work / "proto")
    shutil.copy(ROOT / "buf.yaml", work / "buf.yaml")
    path = work / "proto" / "kvmesh" / "v1" / file
    text = path.read_text()
    assert before in text, f"fixture out of date: {before!r} not in {file}"
    path.write_text(text.replace(before, after))
    return work


def test_protos_lint_and_do_not_break_what_this_branch_started_from() -> None:
    assert proto_compat.main([]) == 0


@pytest.mark.parametrize("change", sorted(BREAKING))
def test_breaking_change_fails(tmp_path: Path, change: str) -> None:
    result = proto_compat.breaking(edited(tmp_path, *BREAKING[change]), ROOT)
    assert result.returncode != 0, f"{change} was not reported:\n{result.stdout}"


def test_added_field_passes(tmp_path: Path) -> None:
    result = proto_compat.breaking(edited(tmp_path, *ADDITIVE), ROOT)
    assert result.returncode == 0, result.stdout + result.stderr

