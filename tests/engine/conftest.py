"""Shared fixtures: the tiny model in a temp dir and small random HF checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmesh.engine.tiny import ensure_tiny_model

# NOTE: without a GPU, Triton kernels run in Triton's interpreter on CPU tensors. Triton reads this
# when a kernel is defined, so it is set before any test module imports the kernels.
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
