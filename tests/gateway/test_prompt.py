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


# The tool parts of Qwen2.5's chat template (Hermes format), as the model ships it.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '\n<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_tools_and_tool_round_trip_render_through_the_template() -> None:
    from kvmesh.gateway.toolparsers import HermesParser, parser_for

    served = ServedModel.load(GatewaySettings(nats_url=""))
    served.tokenizer.chat_template, served.tokenizer._template = QWEN_TOOLS_TEMPLATE, None
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    req = parse_chat({"model": "tiny", "tools": [tool], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4C"},
    ]}, Limits())
    text = served.render_chat(list(req.messages), [t.as_dict() for t in req.tools])
    assert '<tools>{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert "<tool_response>\n4C\n</tool_response>" in text and text.endswith("<|im_start|>assistant")
    assert isinstance(parser_for("auto", QWEN_TOOLS_TEMPLATE), HermesParser)


def test_a_small_body_is_tokenized_on_the_event_loop_and_a_large_one_on_a_thread(model: ServedModel) -> None:
    """A short chat turn costs less to tokenize in place than the hop to a thread; a long prompt
    must not hold up the loop that serves every other stream."""
    import asyncio
    import threading

    from kvmesh.gateway.handlers import INLINE_PREPARE_BYTES, prepare

    threads: list[str] = []

    class Recording:
        def prepare(self, req, default_max_tokens):
            threads.append(threading.current_thread().name)
            return model.prepare(req, default_max_tokens)

    req = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, Limits(4, 64))

    async def main() -> None:
        small = await prepare(Recording(), req, 8, INLINE_PREPARE_BYTES)
        large = await prepare(Recording(), req, 8, INLINE_PREPARE_BYTES + 1)
        assert small == large == model.prepare(req, 8)
        assert threads[0] == threading.current_thread().name
        assert threads[1] != threading.current_thread().name

    asyncio.run(main())


def test_a_token_id_prompt_is_prepared_on_the_event_loop_up_to_its_limit_whatever_its_body_size() -> None:
    """Token ids have no tokenizer work, only checks and block hashes: a hop to a thread cost more than that."""
    import asyncio
    import threading

    from kvmesh.gateway.handlers import INLINE_PREPARE_BYTES, INLINE_PREPARE_TOKEN_IDS, prepare

    threads: list[str] = []

    class Recording:  # NOTE: the fixture's model takes 64 tokens; only where prepare runs matters here
        def prepare(self, req, default_max_tokens):
            threads.append(threading.current_thread().name)
            return len(req.prompt_token_ids)

    limits = Limits(4, 64)
    short = parse_completion({"model": "tiny", "prompt": [65] * 1000}, limits)
    long = parse_completion({"model": "tiny", "prompt": [65] * (INLINE_PREPARE_TOKEN_IDS + 1)}, limits)

    async def main() -> None:
        assert await prepare(Recording(), short, 8, 10 * INLINE_PREPARE_BYTES) == 1000
        assert await prepare(Recording(), long, 8, 10 * INLINE_PREPARE_BYTES) == INLINE_PREPARE_TOKEN_IDS + 1
        assert threads[0] == threading.current_thread().name
        assert threads[1] != threading.current_thread().name

    asyncio.run(main())
