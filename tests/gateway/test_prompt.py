"""Tokenization, context length and max_tokens resolution against the tiny model."""

from __future__ import annotations

import pytest

from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.errors import ApiError
from kvmesh.gateway.prompt import ServedModel, resolve_max_tokens
from kvmesh.gateway.protocol import Limits
from kvmesh.gateway.validate import parse_chat, parse_completion
from kvmesh.runtime.blockhash import BlockHasher


@pytest.fixture(scope="module")
def model() -> ServedModel:
    return ServedModel.load(GatewaySettings(max_model_len=64, nats_url=""))


def test_resolve_max_tokens() -> None:
    assert resolve_max_tokens(10, None, 100, 256) == 90
    assert resolve_max_tokens(10, None, 100, 16) == 16
    assert resolve_max_tokens(10, 90, 100, 16) == 90
    with pytest.raises(ApiError) as info:
        resolve_max_tokens(10, 91, 100, 16, "prompt")
    assert info.value.message == (
        "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
        "(10 in the messages, 91 in the completion). Please reduce the length of the messages or completion."
    )
    assert (info.value.param, info.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(ApiError) as info:
        resolve_max_tokens(100, None, 100, 16)
    assert "your request has 100 input tokens" in info.value.message


def test_served_model_from_settings(model: ServedModel) -> None:
    assert (model.name, model.max_model_len, model.vocab_size) == ("tiny", 64, 264)
    assert model.hasher == BlockHasher("tiny", "float32", 16)


def test_completion_prompt_gets_bos(model: ServedModel) -> None:
    prepared = model.prepare(parse_completion({"model": "tiny", "prompt": "hi"}, Limits()), default_max_tokens=8)
    assert (prepared.token_ids, prepared.block_hashes, prepared.max_tokens) == ([256, 104, 105], [], 8)


def test_chat_uses_the_template(model: ServedModel) -> None:
    req = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, Limits())
    ids = model.prepare(req, 8).token_ids
    assert ids == [256, 260, 104, 105, 262, 261]  # <|bos|><|user|>hi<|end|><|assistant|>


def test_block_hashes_of_full_blocks(model: ServedModel) -> None:
    req = parse_completion({"model": "tiny", "prompt": list(range(33)), "max_tokens": 1}, Limits())
    prepared = model.prepare(req, 8)
    assert prepared.block_hashes == BlockHasher("tiny", "float32", 16).hashes(list(range(33)))
    assert len(prepared.block_hashes) == 2


def test_out_of_vocabulary_ids_are_400(model: ServedModel) -> None:
    with pytest.raises(ApiError) as info:
        model.prepare(parse_completion({"model": "tiny", "prompt": [1, 264]}, Limits()), 8)
    assert (info.value.message, info.value.param) == ("Token id 264 is out of vocabulary (size 264).", "prompt")
    with pytest.raises(ApiError) as info:
        model.prepare(parse_completion({"model": "tiny", "prompt": "x", "stop_token_ids": [999]}, Limits()), 8)
    assert info.value.param == "stop_token_ids"


def test_over_context_chat_names_messages(model: ServedModel) -> None:
    req = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x" * 70}]}, Limits())
    with pytest.raises(ApiError) as info:
        model.prepare(req, 8)
    assert info.value.param == "messages" and "maximum context length is 64 tokens" in info.value.message
