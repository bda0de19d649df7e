"""A mesh where one decode worker is ours and one is examples/hf_decode (HF transformers, started
outside `kvmesh up` and joined with `--external decode=HOST:PORT`): both serve, and greedy
outputs agree whichever worker served them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmesh.engine.tiny import ensure_tiny_model
from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh

from .conftest import MeshHandle, _stop_and_check

pytestmark = pytest.mark.e2e
WORKER = Path(__file__).resolve().parents[2] / "examples" / "hf_decode" / "worker.py"


def test_builtin_and_example_decode_workers_agree(tmp_path) -> None:  # noqa: ANN001
    port = free_port()
    mesh = Mesh(MeshOptions(port=free_port(), run_dir=str(tmp_path), decode=1, prefill=1, policy="round_robin",
                            external=[f"decode=127.0.0.1:{port}"]))
    log = (tmp_path / "hf_decode.log").open("wb")
    example = subprocess.Popen(
        [sys.executable, str(WORKER), "--model-dir", str(ensure_tiny_model()), "--model-name", "tiny", "--port", str(port),
         "--nats", mesh.external_nats_url("decode"), "--worker-id", "hf-decode-0", "--torch-threads", "1"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KVMESH_TRACING": "false"})
    handle = MeshHandle(mesh)
    try:
        mesh.start(timeout_s=180)
        client = handle.openai_client()
        outputs = [client.completions.create(model="tiny", prompt="Swap a service, keep the answers.", max_tokens=24,
                                             temperature=0, extra_body={"ignore_eos": True}).choices[0].text
                   for _ in range(6)]
        served_by_example = (tmp_path / "hf_decode.log").read_text().count("served ")
        served_by_ours = handle.metric("decode-0", "kvmesh_decode_requests_total", status="ok")
        assert served_by_example >= 1 and served_by_ours >= 1, (served_by_example, served_by_ours)
        assert served_by_example + served_by_ours == 6
        assert len(set(outputs)) == 1 and outputs[0], outputs
    finally:
        _stop_and_check(handle)
        example.terminate()
        example.wait(timeout=20)
        log.close()
