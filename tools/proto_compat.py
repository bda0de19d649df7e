"""Proto compatibility: `buf lint` and `buf breaking` on proto/kvmesh/v1 against a git ref.

    python tools/proto_compat.py [--against REF]

The default ref is the last release tag when there is one, else where this branch left main
(`git merge-base HEAD main`; on main itself, the commit before HEAD): so a branch is judged on its
own changes, not on what main gained meanwhile.

buf comes from the `@bufbuild/buf` npm package pinned in tools/buf/package.json (installed here
with `npm ci` when missing). Breaking rules: buf's FILE category (buf.yaml): no field, message,
enum value, RPC or service may be removed, renumbered, retyped or renamed; new ones are fine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools" / "buf"
BUF = TOOLS / "node_modules" / ".bin" / "buf"


def buf() -> str:
    """Path of the buf binary, installing the pinned npm package when it is missing."""
    if not BUF.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("proto-compat: buf is not installed and npm is missing (install Node.js/npm)")
        subprocess.run([npm, "ci", "--prefix", str(TOOLS), "--no-audit", "--no-fund"], check=True)
    return str(BUF)


def _git(*args: str) -> str:
    result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def default_ref() -> str:
    tag = _git("describe", "--tags", "--abbrev=0")
    if tag:
        return tag
    base, head = _git("merge-base", "HEAD", "main"), _git("rev-parse", "HEAD")
    if base and base != head:
        return base
    return "HEAD~1" if _git("rev-parse", "--verify", "-q", "HEAD~1") else "HEAD"


def export(ref: str, into: Path) -> Path:
    """proto/ as of `ref` (with this checkout's buf.yaml) under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "proto"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.copy(ROOT / "buf.yaml", into / "buf.yaml")
    return into


def breaking(workspace: Path, against: Path) -> subprocess.CompletedProcess:
    """`buf breaking` of the workspace (a dir with buf.yaml + proto/) against another."""
    return subprocess.run([buf(), "breaking", str(workspace), "--against", str(against)], capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", default="", help="git ref to compare with (default: see above)")
    args = p.parse_args(argv)
    args.against = args.against or default_ref()
    lint = subprocess.run([buf(), "lint", str(ROOT)], capture_output=True, text=True)
    print(f"buf lint: {'ok' if lint.returncode == 0 else 'FAILED'}\n{lint.stdout}{lint.stderr}".rstrip())
    with tempfile.TemporaryDirectory() as tmp:
        result = breaking(ROOT, export(args.against, Path(tmp)))
    print(f"buf breaking against {args.against}: {'ok' if result.returncode == 0 else 'FAILED'}\n"
          f"{result.stdout}{result.stderr}".rstrip())
    return 1 if lint.returncode or result.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
