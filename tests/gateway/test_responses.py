"""Chunks, final objects, usage and SSE framing built from deltas."""

from __future__ import annotations

import json

import pytest

from kvmesh.gateway.errors import ApiError
from kvmesh.gateway.outputs import Delta, TokenLogprob, Usage
from kvmesh.gateway.protocol import Limits
from kvmesh.gateway.validate import parse_chat, parse_completion
from kvmesh.gateway.responses import SSE_DONE, ResponseBuilder, sse, sse_error, usage_dict


def builder(request) -> ResponseBuilder:
    return ResponseBuilder(request, "id-1", "tiny", 1700000000, token_text=lambda t: chr(t))


def test_sse_framing() -> None:
    assert sse({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"
    err = json.loads(sse_error(ApiError(503, "gone", code="worker_failed"))[6:])
    assert err == {"error": {"message": "gone", "type": "server_error", "param": None, "code": "worker_failed"}}


def test_usage() -> None:
    assert usage_dict(Usage(5, 3, 2)) == {
        "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_completion_chunks() -> None:
    b = builder(parse_completion({"model": "tiny", "prompt": "x", "stream": True}, Limits()))
    assert b.role_chunk() is None
    assert b.chunk(Delta([1], "")) is None  # held-back text: nothing to show
    assert b.chunk(Delta([97], "a")) == {
        "id": "id-1", "object": "text_completion", "created": 1700000000, "model": "tiny",
        "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
    }
    assert b.chunk(Delta([], "", finish_reason="stop"))["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}


def test_chat_chunks_with_usage() -> None:
    req = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True,
                      "stream_options": {"include_usage": True}}, Limits())
    b = builder(req)
    role = b.role_chunk()
    assert role["object"] == "chat.completion.chunk" and role["usage"] is None
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    assert b.chunk(Delta([97], "a", finish_reason="length"))["choices"][0]["delta"] == {"content": "a"}
    assert b.chunk(Delta([], "", finish_reason="stop"))["choices"][0]["delta"] == {}
    last = b.usage_chunk(Usage(2, 1))
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 3


def test_final_objects() -> None:
    b = builder(parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, Limits()))
    final = b.final("hey", "stop", None, Usage(4, 1))
    assert final["object"] == "chat.completion" and final["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "hey"}, "logprobs": None, "finish_reason": "stop"}
    ]
    b = builder(parse_completion({"model": "tiny", "prompt": "x"}, Limits()))
    assert b.final("hey", "length", None, Usage(4, 1))["choices"][0]["text"] == "hey"


def test_completion_logprobs_track_text_offsets() -> None:
    b = builder(parse_completion({"model": "tiny", "prompt": "x", "logprobs": 1}, Limits()))
    first = b.logprobs([TokenLogprob(97, -0.25, ((97, -0.25),)), TokenLogprob(98, float("-inf"), ())])
    assert first == {"tokens": ["a", "b"], "token_logprobs": [-0.25, -9999.0], "top_logprobs": [{"a": -0.25}, {}], "text_offset": [0, 1]}
    assert b.logprobs([TokenLogprob(99, -1.0)])["text_offset"] == [2]


def test_chat_logprobs() -> None:
    b = builder(parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1}, Limits()))
    chunk = b.chunk(Delta([97], "", logprobs=[TokenLogprob(97, -0.5, ((97, -0.5),))]))
    assert chunk["choices"][0]["logprobs"] == {
        "content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}]}]
    }



@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [False, True])
def test_pre_encoded_text_chunk_is_byte_for_byte_the_generic_chunk(chat: bool, include_usage: bool) -> None:
    body = {"model": "tiny", "stream": True, "stream_options": {"include_usage": include_usage}}
    request = parse_chat(body | {"messages": [{"role": "user", "content": "x"}]}, Limits()) if chat else parse_completion(body | {"prompt": "x"}, Limits())
    b = ResponseBuilder(request, 'id-"1', "m\u00e9", 1700000000, token_text=chr)
    delta = Delta([1, 2], 'a "q"\n\u00e9\U0001f642\x00')
    assert b.chunk_bytes(delta) == sse(b.chunk(delta))
    assert b.chunk_bytes(Delta([1], "")) is None
