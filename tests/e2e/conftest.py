"""End-to-end fixtures: real meshes (a real nats-server, every service its own process).

`mesh` is one default mesh shared by the session; `start_mesh(**options)` starts others
(options are `kvmesh.runtime.launcher.MeshOptions` fields) and stops them after the test.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable, Iterator

import psutil
import pytest

from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh

pytestmark = pytest.mark.e2e


class MeshHandle:
    """A running mesh plus what tests need to poke at it."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    @property
    def base_url(self) -> str:
        return self.mesh.gateway_url

    @property
    def metrics_targets(self) -> list[str]:
        return [s.metrics_target for s in self.mesh.specs if s.metrics_target]

    def openai_client(self, **kwargs):
        import openai  # noqa: PLC0415

        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=kwargs.pop("api_key", "unused"),
                             max_retries=0, timeout=kwargs.pop("timeout", 60), **kwargs)

    def spec(self, name: str):
        return next(s for s in self.mesh.specs if s.name == name)

    def metrics_text(self, name: str) -> str:
        with urllib.request.urlopen(f"http://{self.spec(name).metrics_target}/metrics", timeout=5) as reply:
            return reply.read().decode()

    def metric(self, name: str, metric: str, **labels: str) -> float:
        """Sum of a metric's samples on one process whose labels include `labels`."""
        total = 0.0
        for line in self.metrics_text(name).splitlines():
            match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
            if not match or match.group(1) != metric:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(match.group(3))
        return total

    def pid(self, name: str) -> int:
        return self.mesh.pid_of(name)

    def all_pids(self) -> list[int]:
        """Every mesh process and its children (a decode worker's engine process)."""
        pids = []
        for r in self.mesh.procs:
            pids.append(r.proc.pid)
            try:
                pids += [c.pid for c in psutil.Process(r.proc.pid).children(recursive=True)]
            except psutil.Error:
                pass
        return pids

    def stop(self) -> None:
        self.mesh.stop()


def _start(tmp_path_factory: pytest.TempPathFactory, **options) -> MeshHandle:
    run_dir = tmp_path_factory.mktemp("mesh")
    opts = MeshOptions(port=free_port(), run_dir=str(run_dir), **options)
    mesh = Mesh(opts)
    mesh.start(timeout_s=180)
    return MeshHandle(mesh)


def _stop_and_check(handle: MeshHandle) -> None:
    pids = handle.all_pids()
    handle.stop()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left behind after the mesh stopped: {alive}"


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshHandle]:
    handle = _start(tmp_path_factory)
    yield handle
    _stop_and_check(handle)


@pytest.fixture
def start_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., MeshHandle]]:
    started: list[MeshHandle] = []

    def start(**options) -> MeshHandle:
        handle = _start(tmp_path_factory, **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        _stop_and_check(handle)


os.environ.setdefault("KVMESH_LOG_LEVEL", "INFO")
