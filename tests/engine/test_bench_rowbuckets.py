"""bench/rowbuckets.py runs both sides end to end and prints their figures and ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rowbuckets.py"


def test_a_short_run_prints_both_sides_and_their_ratios() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--requests", "60"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["off", "on"]
    assert all(float(cell) > 0 for row in rows for cell in row.strip("|").split("|")[2:])
    assert "# round 1: on / off: prefill p50" in done.stdout
