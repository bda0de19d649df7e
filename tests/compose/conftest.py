"""The compose tests run only under `make test-compose` (marker `compose`, deselected by default):
they need a Docker engine and the images deploy/docker/images.sh builds."""

from __future__ import annotations

import os

import pytest

from .stack import Stack

DECODE_REPLICAS = 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/compose/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.compose)


@pytest.fixture(scope="package")
def stack():
    """compose.yaml + compose.test.yaml up with three decode replicas; `down -v` at the end."""
    project = os.environ.get("KVMESH_COMPOSE_PROJECT", "kvmesh-test")
    stack = Stack(project)
    stack.compose("down", "-v", "--remove-orphans", check=False)
    stack.events = stack.watch_events("start", "health_status")
    try:
        stack.compose("up", "-d", "--no-build", "--scale", f"decode={DECODE_REPLICAS}", timeout_s=600)
        yield stack
    finally:
        stack.close()
        if os.environ.get("KVMESH_COMPOSE_KEEP") != "1":
            stack.compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False)
