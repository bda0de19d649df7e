"""A mesh with mutual TLS on every gRPC hop: it serves, and a client without a certificate is refused."""

from __future__ import annotations

import pytest

from kvmesh.runtime.registry_client import grpc_healthy

from ..runtime.certs import make_certs

pytestmark = pytest.mark.e2e


def test_mutual_tls_mesh_serves_and_refuses_clients_without_certificates(start_mesh, tmp_path):
    paths = make_certs(tmp_path)
    env = {"KVMESH_TLS_CERT": str(paths["cert"]), "KVMESH_TLS_KEY": str(paths["key"]),
           "KVMESH_TLS_CA": str(paths["ca"])}
    handle = start_mesh(prefill=1, decode=1, kvstore=True, env=env)
    prompt = [50 + i % 40 for i in range(120)]  # long enough for the prefill worker and the store
    reply = handle.openai_client().completions.create(model="tiny", prompt=prompt, max_tokens=4)
    assert reply.usage.completion_tokens == 4
    assert handle.metric("decode-0", "kvmesh_decode_remote_prefill_requests_total") == 1
    for process in ("scheduler", "prefill-0", "decode-0", "kvstore"):
        endpoint = handle.spec(process).grpc_endpoint
        assert grpc_healthy(endpoint, timeout_s=5.0, tls=handle.mesh.tls), process  # a loaded host: not 1 s
        assert not grpc_healthy(endpoint), f"{process} answered a plaintext client"
