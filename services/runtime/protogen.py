"""Regenerates the protobuf/gRPC stubs in `runtime/pb/` from `proto/kvmesh/v1/*.proto`.

`python -m kvmesh.runtime.protogen` writes them; `--check` exits 1 when regenerating would change
them. Needs the pinned grpcio-tools (see pyproject's `test` extra). Imports are rewritten to be
relative so the stubs live inside the `kvmesh.runtime.pb` package.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PB_DIR = Path(__file__).parent / "pb"
PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
_IMPORT = re.compile(r"^from kvmesh\.v1 import (\w+) as (\w+)$", re.MULTILINE)


def generate() -> dict[str, str]:
    """Returns {file name: contents} of the stubs for every .proto under proto/kvmesh/v1."""
    from grpc_tools import protoc  # noqa: PLC0415 - a dev-time dependency only

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "kvmesh" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main(args + protos) != 0:
            raise RuntimeError("protoc failed")
        out_dir = Path(tmp) / "kvmesh" / "v1"
        return {p.name: _IMPORT.sub(r"from . import \1 as \2", p.read_text()) for p in sorted(out_dir.iterdir())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    args = parser.parse_args(argv)
    wanted = generate()
    wanted["__init__.py"] = '"""Generated protobuf/gRPC stubs (python -m kvmesh.runtime.protogen). Do not edit."""\n'
    have = {p.name: p.read_text() for p in PB_DIR.glob("*.py*")} if PB_DIR.exists() else {}
    if args.check:
        stale = sorted(n for n in wanted.keys() | have.keys() if wanted.get(n) != have.get(n))
        if stale:
            print("stale stubs (run `make proto`):", ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    PB_DIR.mkdir(exist_ok=True)
    for name in have.keys() - wanted.keys():
        (PB_DIR / name).unlink()
    for name, text in wanted.items():
        (PB_DIR / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
