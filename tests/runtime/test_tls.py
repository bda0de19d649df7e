from types import SimpleNamespace

import grpc
import pytest

from kvmesh.runtime.grpcutil import TlsConfig, check_health, open_channel, start_server
from kvmesh.runtime.pb import scheduler_pb2, scheduler_pb2_grpc

from .certs import make_certs


class Workers(scheduler_pb2_grpc.SchedulerServicer):
    async def ListWorkers(self, request, context):
        return scheduler_pb2.ListWorkersResponse(production_pool="production")


@pytest.fixture
async def tls_server(tmp_path):
    paths = make_certs(tmp_path)
    tls = TlsConfig.from_settings(SimpleNamespace(tls_cert=str(paths["cert"]), tls_key=str(paths["key"]),
                                                  tls_ca=str(paths["ca"])))
    server = await start_server("127.0.0.1", 0, [
        (scheduler_pb2_grpc.add_SchedulerServicer_to_server, Workers(), "kvmesh.v1.Scheduler")], tls=tls)
    yield server, tls
    await server.stop(0)


async def test_a_client_with_a_mesh_certificate_gets_in(tls_server):
    server, tls = tls_server
    async with open_channel(f"127.0.0.1:{server.port}", tls) as channel:
        reply = await scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(scheduler_pb2.ListWorkersRequest(),
                                                                             timeout=5)
    assert reply.production_pool == "production"
    assert await check_health(f"127.0.0.1:{server.port}", tls=tls)


async def test_a_plaintext_client_is_refused(tls_server):
    server, _ = tls_server
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_tls_client_without_a_certificate_is_refused(tls_server):
    server, tls = tls_server
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca)
    async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", credentials) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(scheduler_pb2.ListWorkersRequest(), timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_partial_tls_settings_are_an_error():
    with pytest.raises(ValueError, match="TLS needs all of"):
        TlsConfig.from_settings(SimpleNamespace(tls_cert="a.pem", tls_key="", tls_ca=""))
