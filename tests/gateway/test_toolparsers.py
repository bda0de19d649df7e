"""Tool-call parsers on the formats Qwen2.5 (Hermes) and Llama 3.1 emit, malformed output included."""

from __future__ import annotations

import json

from kvmesh.gateway.protocol import ToolChoice
from kvmesh.gateway.toolparsers import HermesParser, Llama3JsonParser, forced_calls, parser_for
from kvmesh.gateway.toolstream import ToolCallStream


def calls(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_hermes_calls_and_leading_content() -> None:
    text = (
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"
    )
    parsed = HermesParser().parse(text)
    assert parsed.content == "Let me check."
    assert calls(parsed) == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert parsed.tool_calls[0].id.startswith("chatcmpl-tool-") and parsed.tool_calls[0].id != parsed.tool_calls[1].id


def test_hermes_without_closing_tag_and_plain_text() -> None:
    assert calls(HermesParser().parse('<tool_call>{"name": "f", "arguments": {"x": 1}}')) == [("f", {"x": 1})]
    assert HermesParser().parse("just words") .content == "just words"


def test_hermes_malformed_stays_content() -> None:
    for text in ('<tool_call>\n{"name": "f", "arguments": {\n</tool_call>', "<tool_call>[1, 2]</tool_call>",
                 '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": "f", "arguments": 3}</tool_call>'):
        parsed = HermesParser().parse(text)
        assert (parsed.content, parsed.tool_calls) == (text, ())


def test_llama3_json_calls() -> None:
    parsed = Llama3JsonParser().parse('<|python_tag|>{"name": "a", "parameters": {"q": "x"}}; {"name": "b", "parameters": {}}')
    assert (parsed.content, calls(parsed)) == (None, [("a", {"q": "x"}), ("b", {})])
    assert calls(Llama3JsonParser().parse(' {"name": "a", "arguments": {"k": 2}}')) == [("a", {"k": 2})]


def test_llama3_malformed_or_prose_stays_content() -> None:
    for text in ("The answer is 4.", '{"name": "a", "parameters": {', '{"x": 1}', '{"name": "a", "parameters": {}} trailing'):
        parsed = Llama3JsonParser().parse(text)
        assert (parsed.content, parsed.tool_calls) == (text, ())


def test_parser_chosen_by_template() -> None:
    assert isinstance(parser_for("auto", "{% if tools %}<tool_call>{% endif %}"), HermesParser)
    assert isinstance(parser_for("auto", "<|start_header_id|>ipython<|end_header_id|>"), Llama3JsonParser)
    assert isinstance(parser_for("llama3_json", None), Llama3JsonParser)


def test_forced_calls() -> None:
    named = forced_calls('{"city": "Oslo"}', ToolChoice.NAMED, "get_weather")
    assert calls(named) == [("get_weather", {"city": "Oslo"})]
    required = forced_calls('[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]', ToolChoice.REQUIRED, None)
    assert calls(required) == [("f", {"a": 1}), ("g", {})]
    cut = forced_calls('[{"name": "f", "param', ToolChoice.REQUIRED, None)
    assert (cut.content, cut.tool_calls) == ('[{"name": "f", "param', ())


def stream(s: ToolCallStream, pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    content = "".join(s.push(p) for p in pieces)
    rest, found = s.finish()
    return content + rest, [(c.name, json.loads(c.arguments)) for c in found]


def test_stream_holds_a_hermes_call_split_across_deltas() -> None:
    s = ToolCallStream(HermesParser(), ToolChoice.AUTO)
    assert s.push("Sure. <tool") == "Sure. "
    assert s.push("_call>{\"name\": \"f\", ") == ""
    assert stream(s, ['"arguments": {}}</tool_call>']) == ("", [("f", {})])


def test_stream_releases_text_that_only_looked_like_a_call() -> None:
    assert stream(ToolCallStream(HermesParser(), ToolChoice.AUTO), ["a <tool", "box> b"]) == ("a <toolbox> b", [])
    assert stream(ToolCallStream(HermesParser(), ToolChoice.AUTO), ["<tool_call>{oops"]) == ("<tool_call>{oops", [])
    assert stream(ToolCallStream(Llama3JsonParser(), ToolChoice.AUTO), [" ", "Hi", " there"]) == (" Hi there", [])
    assert stream(ToolCallStream(Llama3JsonParser(), ToolChoice.AUTO), ['{"name": "a", ', '"parameters": {}}']) == ("", [("a", {})])


def test_stream_forced_choice_holds_everything() -> None:
    s = ToolCallStream(HermesParser(), ToolChoice.NAMED, "f")
    assert s.push('{"x"') == "" and s.push(": 1}") == ""
    assert s.finish()[1][0].name == "f"
