"""A decode worker on 127.0.0.1:0 with the tiny model, no NATS; and the engine it must agree with."""

from __future__ import annotations

import grpc
import pytest

from kvmesh.decode.main import start
from kvmesh.runtime.pb import decode_pb2_grpc

from .helpers import decode_settings, make_reference


@pytest.fixture(scope="session")
def reference():
    return make_reference()


@pytest.fixture
async def decode():
    app = await start(decode_settings())
    yield app
    await app.stop()


@pytest.fixture
async def stub(decode):
    async with grpc.aio.insecure_channel(decode.endpoint) as channel:
        yield decode_pb2_grpc.DecodeWorkerStub(channel)
