"""Chat messages into the dicts a chat template renders (pure), tool round-trips included.

Roles: system (and developer), user, assistant, tool. An assistant message may carry
`tool_calls` (its `function.arguments` a JSON string, as OpenAI sends it); like vLLM, the
arguments are handed to the template as an object, which is what Qwen2.5's and Llama 3.1's
templates render. A `tool` message carries the result of one call (`tool_call_id`, content).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import invalid
from .protocol import ChatMessage

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def chat_messages(messages: list[ChatMessage]) -> tuple[dict[str, Any], ...]:
    """The messages as template input; a 400 naming the first bad field."""
    if not messages:
        raise invalid("messages must contain at least one message.", "messages")
    out = []
    for i, msg in enumerate(messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise invalid(
                f"Unsupported role {msg.role!r}; expected one of system, developer, user, assistant, tool.",
                f"messages.[{i}].role",
            )
        entry: dict[str, Any] = {"role": role, "content": _content(msg, i)}
        if msg.tool_calls:
            if role != "assistant":
                raise invalid("Only assistant messages may carry tool_calls.", f"messages.[{i}].tool_calls")
            entry["tool_calls"] = [_tool_call(call, f"messages.[{i}].tool_calls.[{j}]") for j, call in enumerate(msg.tool_calls)]
        if role == "tool":
            if msg.tool_call_id is not None:
                entry["tool_call_id"] = msg.tool_call_id
            if msg.name is not None:
                entry["name"] = msg.name
        out.append(entry)
    return tuple(out)


def _tool_call(call: dict[str, Any], param: str) -> dict[str, Any]:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise invalid("A tool call needs a 'function' with a 'name'.", f"{param}.function")
    arguments = fn.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as exc:
            raise invalid(f"function.arguments is not valid JSON: {exc}", f"{param}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise invalid("function.arguments must be a JSON object.", f"{param}.function.arguments")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _content(msg: ChatMessage, i: int) -> str:
    if msg.content is None:
        if msg.role == "assistant":
            return ""
        raise invalid(f"Missing content in a {msg.role!r} message.", f"messages.[{i}].content")
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for j, part in enumerate(msg.content):
        kind = part.get("type")
        if kind != "text":
            raise invalid(
                f"Only text content parts are supported, got {kind!r}.", f"messages.[{i}].content.[{j}].type", "unsupported_content"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid("A text content part needs a string 'text'.", f"messages.[{i}].content.[{j}].text")
        texts.append(text)
    return "\n".join(texts)
