"""`python -m kvmesh.gateway` starts, serves, and exits cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "kvmesh.gateway", "--port", str(port), "--scheduler", "127.0.0.1:9",
           "--trace-dir", str(tmp_path), "--nats-url", ""]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gateway never came up"
                time.sleep(0.1)
        assert models.json()["data"][0]["id"] == "tiny"
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5.0).status_code == 503  # no scheduler there
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
