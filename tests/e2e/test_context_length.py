"""Long contexts through the mesh: the workers' real max_model_len is what the gateway advertises
and enforces, and a 6,000-token prompt works on a checkpoint whose config allows it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from kvmesh.engine.tiny import ensure_tiny_model

from .polling import eventually

pytestmark = pytest.mark.e2e

LONG = 6000
WORKER_MAX_LEN = 7000  # the decode worker's engine cap; below the checkpoint's 8192


@pytest.fixture(scope="module")
def long_mesh(tmp_path_factory: pytest.TempPathFactory):
    from .conftest import _start, _stop_and_check  # noqa: PLC0415

    tiny = ensure_tiny_model(tmp_path_factory.mktemp("cache"))
    path = tmp_path_factory.mktemp("models") / "tiny-8k"
    shutil.copytree(tiny, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    handle = _start(tmp_path_factory, model=str(path), prefill=1, decode=1, kvstore=False,
                    settings=[f"decode.max_model_len={WORKER_MAX_LEN}"])
    yield handle
    _stop_and_check(handle)


def advertised(handle) -> int:
    reply = httpx.get(f"{handle.base_url}/v1/models", timeout=10).json()
    return reply["data"][0]["max_model_len"]


def test_gateway_advertises_what_the_workers_report(long_mesh) -> None:
    assert eventually(lambda: advertised(long_mesh) == WORKER_MAX_LEN, timeout_s=20)


def test_six_thousand_token_prompt_completes(long_mesh) -> None:
    prompt = [33 + (i * 13) % 200 for i in range(LONG)]
    reply = long_mesh.openai_client(timeout=240).completions.create(
        model="tiny-8k", prompt=prompt, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.prompt_tokens == LONG and reply.usage.completion_tokens == 4


def test_prompt_plus_max_tokens_beyond_the_reported_length_is_a_400(long_mesh) -> None:
    import openai  # noqa: PLC0415

    assert eventually(lambda: advertised(long_mesh) == WORKER_MAX_LEN, timeout_s=20)
    with pytest.raises(openai.BadRequestError) as err:
        long_mesh.openai_client().completions.create(model="tiny-8k", prompt=[40] * LONG, max_tokens=WORKER_MAX_LEN - LONG + 1)
    assert f"maximum context length is {WORKER_MAX_LEN}" in str(err.value)
