"""Tool calls out of model text (pure): Hermes-style (Qwen2/2.5) and Llama 3.1+ JSON parsers.

- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any number of them;
  the text before the first one is content.
- llama3_json: the output is `<|python_tag|>`? then one or more `{"name": ..., "parameters": {...}}`
  separated by `;` (the template's JSON tool-call format); anything else is content.

Output that looks like a call but does not parse stays content, as vLLM does: never a 500.
`tool_choice` required / named outputs are JSON enforced by a grammar (`structured.py`) and are
turned into calls by `forced_calls`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .protocol import ToolChoice


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


class HermesParser:
    """Qwen2/2.5 and other Hermes-format models."""

    name = "hermes"
    start = "<tool_call>"
    anywhere = True  # a call may follow some content
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        if self.start not in text:
            return ParsedOutput(text)
        calls = []
        for body in self._CALL.findall(text):
            call = _call_from(_loads(body.strip()), "arguments")
            if call is None:
                return ParsedOutput(text)
            calls.append(call)
        content = text[: text.index(self.start)].strip()
        return ParsedOutput(content or None, tuple(calls))


class Llama3JsonParser:
    """Llama 3.1+ JSON tool calls (optionally after `<|python_tag|>`), `;`-separated."""

    name = "llama3_json"
    start = "<|python_tag|>"
    anywhere = False  # only a whole output that is calls is parsed as calls
    _DECODER = json.JSONDecoder()

    def parse(self, text: str) -> ParsedOutput:
        body = text.strip().removeprefix(self.start).lstrip()
        if not body.startswith("{"):
            return ParsedOutput(text)
        calls, pos = [], 0
        while pos < len(body):
            try:
                obj, end = self._DECODER.raw_decode(body, pos)
            except json.JSONDecodeError:
                return ParsedOutput(text)
            call = _call_from(obj, "parameters")
            if call is None:
                return ParsedOutput(text)
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return ParsedOutput(None, tuple(calls))

    def starts_call(self, text: str) -> bool:
        body = text.lstrip()
        return body.startswith("{") or body.startswith(self.start)


PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def parser_for(name: str, chat_template: str | None) -> HermesParser | Llama3JsonParser:
    """The parser by name; `auto` picks by the chat template (Hermes markers, else Llama's)."""
    if name != "auto":
        return PARSERS[name]()
    template = chat_template or ""
    if "<|python_tag|>" in template or ("ipython" in template and "<tool_call>" not in template):
        return Llama3JsonParser()
    return HermesParser()


def forced_calls(text: str, choice: ToolChoice, name: str | None) -> ParsedOutput:
    """Calls from grammar-enforced output: the arguments of `name`, or an array of
    `{"name", "parameters"}` for required. Unparseable (cut by max_tokens) stays content."""
    obj = _loads(text)
    if choice is ToolChoice.NAMED and isinstance(obj, dict) and name:
        return ParsedOutput(None, (ToolCall(name, json.dumps(obj, ensure_ascii=False)),))
    if choice is ToolChoice.REQUIRED and isinstance(obj, list) and obj:
        calls = [_call_from(item, "parameters") for item in obj]
        if all(c is not None for c in calls):
            return ParsedOutput(None, tuple(c for c in calls if c is not None))
    return ParsedOutput(text)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _call_from(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments" if args_key == "parameters" else "parameters", {}))
    if isinstance(args, str):
        args = _loads(args)
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
