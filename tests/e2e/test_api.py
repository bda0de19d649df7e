"""What agents and eval tools send, with the official openai client on the shared real mesh:
structured outputs, tool calls, n, logit_bias, prompt logprobs, tokenize/version/health."""

from __future__ import annotations

import json
import urllib.request

import jsonschema
import pytest

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams

from .polling import eventually

pytestmark = pytest.mark.e2e

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": SCHEMA}}]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def post(mesh, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{mesh.base_url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_output_validates_even_with_random_weights(mesh, seed: int):
    reply = mesh.openai_client().chat.completions.create(
        model="tiny", messages=ASK, max_tokens=120, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_guided_choice_and_bad_grammar(mesh):
    client = mesh.openai_client()
    reply = client.completions.create(model="tiny", prompt="Pick:", max_tokens=10, extra_body={"guided_choice": ["up", "down"]})
    assert reply.choices[0].text in ("up", "down")
    import openai  # noqa: PLC0415

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=4, extra_body={"guided_regex": "(("})
    assert "invalid regex for structured output" in info.value.body["message"]


def test_tool_choice_required_returns_a_call_whose_arguments_validate(mesh):
    reply = mesh.openai_client().chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=3
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)


def test_tool_choice_required_streams_tool_call_deltas(mesh):
    stream = mesh.openai_client().chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=3, stream=True
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or ():
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMA)


def test_full_tool_round_trip(mesh):
    client = mesh.openai_client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=200, seed=4)
    call = first.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 4}'},
    ]
    answer = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert isinstance(answer.choices[0].message.content, str) and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens


def test_n_3_gives_three_choices_from_one_prefill(mesh):
    prompt = [40 + (i * 13) % 70 for i in range(96)]  # 6 full blocks
    hits = mesh.metric("decode-0", "kvmesh_decode_prefix_hit_tokens_total")
    reply = mesh.openai_client().completions.create(model="tiny", prompt=prompt, n=3, max_tokens=6, temperature=1.0, seed=9,
                                                    extra_body={"ignore_eos": True})
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (96, 18)
    # choices 1 and 2 find the prompt's 5 full blocks (80 tokens; the last is recomputed) cached
    assert eventually(lambda: mesh.metric("decode-0", "kvmesh_decode_prefix_hit_tokens_total") - hits >= 2 * 80)


def test_logit_bias_100_makes_every_token_that_token(mesh):
    reply = mesh.openai_client().completions.create(model="tiny", prompt="Hello", max_tokens=10, temperature=1.0,
                                                    logit_bias={"120": 100})
    assert reply.choices[0].text == "x" * 10


def test_echo_logprobs_max_tokens_zero_is_the_prompts_logprobs(mesh):
    prompt = "The quick brown fox jumps over the lazy dog"
    reply = mesh.openai_client().completions.create(model="tiny", prompt=prompt, echo=True, logprobs=1, max_tokens=0)
    choice = reply.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length" and reply.usage.completion_tokens == 0
    lp = choice.logprobs
    engine = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=16))
    ids = engine.tokenizer.encode(prompt)
    engine.add_request("ref", ids, SamplingParams(max_tokens=0, prompt_logprobs=1))
    outs = []
    while not (outs and outs[-1].finished):
        outs += engine.step()
    ref = outs[-1].prompt_logprobs
    assert len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([e.logprob for e in ref], abs=1e-4)
    assert len(lp.top_logprobs[1]) == 1


def test_tokenize_detokenize_version_health(mesh):
    tok = post(mesh, "/tokenize", {"model": "tiny", "prompt": "hi"})
    assert tok == {"count": 3, "max_model_len": 2048, "tokens": [256, 104, 105], "token_strs": None}
    chat = post(mesh, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True})
    assert chat["count"] == len(chat["tokens"]) == len(chat["token_strs"]) and chat["token_strs"][-1] == "<|assistant|>"
    assert post(mesh, "/detokenize", {"tokens": [104, 105]}) == {"prompt": "hi"}
    with urllib.request.urlopen(f"{mesh.base_url}/version", timeout=5) as reply:
        assert json.loads(reply.read())["version"]
    with urllib.request.urlopen(f"{mesh.base_url}/health", timeout=5) as reply:
        assert reply.status == 200
