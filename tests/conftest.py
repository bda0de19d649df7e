"""Fixtures shared by every test folder."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvmesh.runtime.launcher import free_port
from kvmesh.runtime.supervisor import _wait_tcp, nats_server_binary


@dataclass
class NatsServer:
    """A real nats-server on a free loopback port; `restart()` keeps the port."""

    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_tcp("127.0.0.1", self.port, timeout_s=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer(free_port())
    server.start()
    yield server
    server.stop()
