"""Gateway test harness: fake scheduler/decode servers and a real uvicorn serving the app."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from kvmesh.gateway.backend import Backend
from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.main import _Server
from kvmesh.gateway.metrics import GatewayMetrics
from kvmesh.gateway.prompt import ServedModel
from kvmesh.gateway.server import create_app

from .fakes import FakeMesh, start_fake_mesh

_MODELS: dict[str, ServedModel] = {}


def tiny_model(settings: GatewaySettings) -> ServedModel:
    key = f"{settings.model}/{settings.max_model_len}/{settings.block_size}"
    if key not in _MODELS:
        _MODELS[key] = ServedModel.load(settings)
    return _MODELS[key]


async def eventually(condition, timeout_s: float = 5.0) -> None:
    """Waits until `condition()` holds (state another task updates), failing after timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


@dataclass
class RunningGateway:
    url: str
    app: FastAPI
    settings: GatewaySettings
    metrics: GatewayMetrics
    model: ServedModel

    def client(self, **kwargs) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=kwargs.pop("timeout", 10.0), **kwargs)


@asynccontextmanager
async def run_gateway(mesh: FakeMesh | None, **overrides) -> AsyncIterator[RunningGateway]:
    """Serves the gateway app with real uvicorn on 127.0.0.1:<free port>."""
    overrides.setdefault("scheduler", mesh.scheduler_endpoint if mesh else "127.0.0.1:1")
    overrides.setdefault("nats_url", "")
    settings = GatewaySettings(**overrides)
    model = tiny_model(settings)
    backend = Backend(settings, model.hasher, model.tokenizer.eos_token_ids, model.tokenizer)
    metrics = GatewayMetrics()
    app = create_app(settings, backend, model=model, metrics=metrics)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task.result()
        await asyncio.sleep(0.01)
    try:
        yield RunningGateway(f"http://127.0.0.1:{sock.getsockname()[1]}", app, settings, metrics, model)
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def mesh() -> AsyncIterator[FakeMesh]:
    mesh = await start_fake_mesh(num_decode=2)
    yield mesh
    await mesh.stop()


@pytest.fixture
async def gateway(mesh: FakeMesh) -> AsyncIterator[RunningGateway]:
    async with run_gateway(mesh) as gw:
        yield gw
