"""Request validation: exact messages and params for what users get wrong."""

from __future__ import annotations

import json

import pytest

from kvmesh.gateway.errors import ApiError
from kvmesh.gateway.protocol import Endpoint, GuideKind, Limits, SamplingSpec, StructuredSpec, ToolChoice
from kvmesh.gateway.validate import parse_chat, parse_completion, parse_json

LIMITS = Limits(max_stop_sequences=4, max_stop_length=8)


def completion(**fields):
    return parse_completion({"model": "tiny", "prompt": "hi"} | fields, LIMITS)


def chat(**fields):
    return parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]} | fields, LIMITS)


def rejects(call, **fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(**fields)
    assert info.value.status == 400
    return info.value


def test_defaults() -> None:
    req = completion()
    assert (req.endpoint, req.model, req.prompt, req.max_tokens, req.stream, req.include_usage) == (
        Endpoint.COMPLETIONS, "tiny", "hi", None, False, False,
    )
    assert req.sampling == SamplingSpec()


def test_prompt_forms() -> None:
    assert completion(prompt=[1, 2]).prompt_token_ids == (1, 2)
    assert completion(prompt=["one"]).prompt == "one"
    assert completion(prompt=[[5, 6]]).prompt_token_ids == (5, 6)
    err = rejects(completion, prompt=["a", "b"])
    assert (err.message, err.param) == ("Batched prompts (2 prompts) are not supported; send one prompt per request.", "prompt")
    assert rejects(completion, prompt="").message == "prompt must not be empty."
    assert rejects(completion, prompt=[]).param == "prompt"
    assert rejects(completion, prompt=[-1]).message == "prompt token ids must be non-negative."


def test_wrong_types_name_the_param() -> None:
    err = rejects(completion, max_tokens="5")
    assert (err.message, err.param, err.code) == ("Invalid value for 'max_tokens': Input should be a valid integer.", "max_tokens", "invalid_value")
    err = rejects(completion, prompt={"x": 1})
    assert (err.message, err.param, err.code) == ("Invalid type for 'prompt': got an object.", "prompt", "invalid_type")
    assert rejects(completion, max_tokens=True).param == "max_tokens"  # booleans are not integers
    assert rejects(chat, messages=[{"role": "user", "content": 3}]).param == "messages.[0].content"


def test_missing_required_fields() -> None:
    with pytest.raises(ApiError) as info:
        parse_completion({"prompt": "x"}, LIMITS)
    assert (info.value.message, info.value.param) == ("Missing required parameter: 'model'.", "model")
    with pytest.raises(ApiError) as info:
        parse_chat({"model": "tiny"}, LIMITS)
    assert info.value.param == "messages"


def test_max_tokens() -> None:
    assert rejects(completion, max_tokens=0).message == "max_tokens must be at least 1, got 0."
    err = rejects(chat, max_completion_tokens=-3)
    assert (err.message, err.param) == ("max_completion_tokens must be at least 1, got -3.", "max_completion_tokens")
    req = chat(max_tokens=5, max_completion_tokens=9)
    assert (req.max_tokens, req.max_tokens_param) == (9, "max_completion_tokens")


def test_sampling_ranges() -> None:
    assert rejects(completion, temperature=2.5).message == "temperature must be between 0 and 2, got 2.5."
    assert rejects(completion, top_p=0).message == "top_p must be in (0, 1], got 0.0."
    assert rejects(completion, top_k=-2).message == "top_k must be -1 or 0 (off) or a positive count, got -2."
    assert rejects(completion, top_k=2**31).param == "top_k"
    assert rejects(completion, temperature=float("nan")).param == "temperature"
    assert rejects(completion, seed=2**64).param == "seed"
    spec = completion(temperature=0, top_k=-1, seed=-5, stop="x").sampling
    assert (spec.temperature, spec.top_k, spec.seed, spec.stop) == (0.0, 0, -5, ("x",))


def test_stop_limits() -> None:
    assert rejects(completion, stop=list("abcde")).message == "At most 4 stop sequences are allowed, got 5."
    assert rejects(completion, stop=["123456789"]).message == "Stop sequences must be at most 8 characters, got 9."
    assert rejects(completion, stop=[""]).message == "Stop sequences must not be empty."


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"n": 0}, "n"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": "!"}, "suffix"),
        ({"logit_bias": {"a": 5}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"priority": "high"}, "priority"),
        ({"priority": 2**40}, "priority"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"echo": True, "max_tokens": 0}, "max_tokens"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": "{"}, "guided_json"),
        ({"guided_json": {}, "guided_regex": "a"}, "guided_regex"),
        ({"logprobs": 21}, "logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_completion_refusals(fields: dict, param: str) -> None:
    assert rejects(completion, **fields).param == param


def test_harmless_values_of_refused_fields_pass() -> None:
    req = completion(n=1, best_of=1, echo=False, presence_penalty=0, logprobs=0, stream=True, stream_options={"include_usage": True})
    assert (req.sampling.logprobs, req.include_usage) == (0, True)
    assert rejects(completion, n=9).message == "n must be between 1 and 8, got 9."


def test_sampling_fields() -> None:
    req = completion(
        n=3, presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2, logit_bias={"7": 100, "3": -5.5},
        min_tokens=2, min_p=0.1, priority=-5, max_tokens=4, stop_token_ids=[9],
    )
    s = req.sampling
    assert (req.n, req.priority) == (3, -5)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_tokens, s.min_p) == (0.5, -1, 1.2, 2, 0.1)
    assert s.logit_bias == ((3, -5.5), (7, 100.0)) and s.stop_token_ids == (9,)


def test_echo_logprobs_max_tokens_zero_asks_for_prompt_logprobs() -> None:
    req = completion(echo=True, logprobs=1, max_tokens=0)
    assert (req.echo, req.max_tokens, req.sampling.prompt_logprobs, req.sampling.logprobs) == (True, 0, 1, 1)
    assert completion(echo=True).sampling.prompt_logprobs is None


def test_structured_sources() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}).sampling.structured
    assert (spec.kind, json.loads(spec.spec)) == (GuideKind.JSON, schema)
    assert chat(response_format={"type": "json_object"}).sampling.structured == StructuredSpec(GuideKind.JSON, '{"type": "object"}')
    assert completion(guided_json=json.dumps(schema)).sampling.structured.spec == json.dumps(schema)
    assert completion(guided_regex="a+").sampling.structured == StructuredSpec(GuideKind.REGEX, "a+")
    assert completion(guided_choice=["yes", 'n"o']).sampling.structured == StructuredSpec(GuideKind.GRAMMAR, 'root ::= "yes" | "n\\"o"')
    assert completion(structured_outputs={"grammar": "root ::= \"a\""}).sampling.structured.kind is GuideKind.GRAMMAR
    assert chat(response_format={"type": "text"}).sampling.structured is None


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_tools_and_tool_choice() -> None:
    auto = chat(tools=[TOOL])
    assert (auto.tool_choice, auto.tools[0].name, auto.sampling.structured) == (ToolChoice.AUTO, "get_weather", None)
    assert chat(tools=[TOOL], tool_choice="none").tool_choice is ToolChoice.NONE
    named = chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (named.tool_choice, named.tool_name) == (ToolChoice.NAMED, "get_weather")
    assert json.loads(named.sampling.structured.spec) == TOOL["function"]["parameters"]
    required = json.loads(chat(tools=[TOOL], tool_choice="required").sampling.structured.spec)
    assert required["type"] == "array" and required["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert "maxItems" not in required
    one = json.loads(chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=False).sampling.structured.spec)
    assert one["maxItems"] == 1


def test_tool_round_trip_messages() -> None:
    req = chat(
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "4C"},
        ],
    )
    assert req.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}, "id": "c1"}]
    assert req.messages[2] == {"role": "tool", "content": "4C", "tool_call_id": "c1"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools.[0].function"),
        ({"tools": [TOOL, TOOL]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.[0].role"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{}]}]}, "messages.[0].tool_calls.[0].function"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}, "messages.[0].tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]},
         "messages.[0].tool_calls.[0].function.arguments"),
    ],
)
def test_chat_refusals(fields: dict, param: str) -> None:
    assert rejects(chat, **fields).param == param


def test_chat_messages_normalised() -> None:
    req = chat(
        messages=[
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ],
        logprobs=True,
        response_format={"type": "text"},
    )
    assert req.messages == ({"role": "system", "content": "rules"}, {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": ""})
    assert req.sampling.logprobs == 0


def test_parse_json() -> None:
    assert parse_json(b'{"a": 1}') == {"a": 1}
    for raw in (b"{", b"[1]", b"\xff"):
        with pytest.raises(ApiError) as info:
            parse_json(raw)
        assert (info.value.status, info.value.code) == (400, "invalid_json")
