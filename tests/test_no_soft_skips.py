"""Issue 16, item 8: a skip must not hide breakage. No test module may skip because one of our own
modules fails to import ("not written yet"), and every skip names an outside condition."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
# NOTE: skips allowed for what lies outside the project: an optional package, a device, a binary.
OWN_IMPORT_SKIP = re.compile(r"importorskip\(\s*[\"']kvmesh")
NOT_WRITTEN = re.compile(r"skip[^\n]*(not (yet )?(written|implemented)|TODO)", re.IGNORECASE)
SKIP_ON_IMPORT_ERROR = re.compile(r"except\s+(ImportError|ModuleNotFoundError)[^\n]*:\s*\n\s*pytest\.skip")


def test_no_test_skips_on_our_own_missing_or_broken_code() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__):
            continue
        source = path.read_text(encoding="utf-8")
        for pattern in (OWN_IMPORT_SKIP, NOT_WRITTEN, SKIP_ON_IMPORT_ERROR):
            offenders += [f"{path.relative_to(TESTS)}: {m.group(0)!r}" for m in pattern.finditer(source)]
    assert not offenders, "skips that would turn our own breakage into a skip:\n" + "\n".join(offenders)
