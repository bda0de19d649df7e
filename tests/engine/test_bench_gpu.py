"""bench/gpu.py: its CPU smoke mode runs end to end; without CUDA the full run stops with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_smoke_mode_prints_every_figure() -> None:
    done = run("--smoke")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "copy bandwidth (read + write):" in out
    assert out.count("rel err") == 2
    errs = [float(line.split("rel err")[1].split()[0]) for line in out.splitlines() if "rel err" in line]
    assert all(e < 1e-4 for e in errs)
    assert "of bound" in out and "prefill 64 tokens:" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_full_run_without_cuda_says_what_it_needs() -> None:
    done = run()
    assert done.returncode == 2
    assert "needs a CUDA device" in done.stderr and "--smoke" in done.stderr
