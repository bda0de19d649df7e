"""Structured outputs and tools in a request: validation into a `StructuredSpec` (pure).

Sources, at most one per request: `response_format` (`json_object`, `json_schema` with `strict`),
vLLM's `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, or the same under
`structured_outputs` (`json`, `regex`, `choice`, `grammar`). The engine compiles the spec with
xgrammar; a spec it cannot compile comes back as INVALID_ARGUMENT, which the gateway answers 400.

`tool_choice` `required` and a named function are enforced the way vLLM does it: the output must
match a JSON schema (an array of `{"name", "parameters"}` for required, the function's parameters
for a named one), and the gateway turns that JSON into `tool_calls`.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import invalid
from .protocol import CommonBody, GuideKind, StructuredSpec, ToolChoice, ToolSpec

MAX_TOOLS = 128
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_spec(body: CommonBody) -> StructuredSpec | None:
    """The one output constraint the request asks for, or None."""
    found: list[tuple[str, StructuredSpec]] = []
    fmt = body.response_format
    if fmt is not None:
        spec = _response_format(fmt)
        if spec is not None:
            found.append(("response_format", spec))
    for field, kind in _GUIDED.items():
        value = getattr(body, field)
        if value is not None:
            found.append((field, _guided(kind, value, field)))
    for kind, value in (body.structured_outputs or {}).items():
        if kind in ("json", "regex", "choice", "grammar") and value is not None:
            found.append((f"structured_outputs.{kind}", _guided(kind, value, f"structured_outputs.{kind}")))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise invalid(f"Only one structured output constraint may be set per request, got {names}.", found[1][0])
    return found[0][1] if found else None


def _response_format(fmt: dict[str, Any]) -> StructuredSpec | None:
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredSpec(GuideKind.JSON, '{"type": "object"}')
    if kind != "json_schema":
        raise invalid(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}.", "response_format.type")
    inner = fmt.get("json_schema")
    if not isinstance(inner, dict):
        raise invalid("response_format.json_schema must be an object with a 'schema'.", "response_format.json_schema")
    name = inner.get("name", "response")
    if not isinstance(name, str) or not name:
        raise invalid("response_format.json_schema.name must be a non-empty string.", "response_format.json_schema.name")
    strict = inner.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise invalid("response_format.json_schema.strict must be a boolean.", "response_format.json_schema.strict")
    schema = inner.get("schema", {})
    return StructuredSpec(GuideKind.JSON, _schema_text(schema, "response_format.json_schema.schema"))


def _guided(kind: str, value: Any, param: str) -> StructuredSpec:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise invalid(f"{param} is not valid JSON: {exc}", param) from None
        return StructuredSpec(GuideKind.JSON, _schema_text(value, param))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise invalid(f"{param} must be a non-empty list of non-empty strings.", param)
        return StructuredSpec(GuideKind.GRAMMAR, choice_grammar(value))
    if not isinstance(value, str) or not value:
        raise invalid(f"{param} must be a non-empty string.", param)
    return StructuredSpec(GuideKind.REGEX if kind == "regex" else GuideKind.GRAMMAR, value)


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, bool):
        schema = {} if schema else None
    if not isinstance(schema, dict):
        raise invalid(f"{param} must be a JSON schema object.", param)
    return json.dumps(schema)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar (xgrammar's dialect) whose language is exactly `choices`."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


# ---- tools --------------------------------------------------------------------------------


def parse_tools(tools: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    """The request's `tools`, checked: type function, a name, an object schema of parameters."""
    if not tools:
        return ()
    if len(tools) > MAX_TOOLS:
        raise invalid(f"At most {MAX_TOOLS} tools are allowed, got {len(tools)}.", "tools")
    out: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        param = f"tools.[{i}]"
        if tool.get("type", "function") != "function":
            raise invalid(f"Only tools of type 'function' are supported, got {tool.get('type')!r}.", f"{param}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise invalid("A tool needs a 'function' object.", f"{param}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise invalid("A function needs a 'name' of 1-64 characters.", f"{param}.function.name")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid("A function's 'description' must be a string.", f"{param}.function.description")
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise invalid("A function's 'parameters' must be a JSON schema object.", f"{param}.function.parameters")
        out.append(ToolSpec(name, description, parameters))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise invalid("Function names in 'tools' must be unique.", "tools")
    return tuple(out)


def parse_tool_choice(choice: str | dict[str, Any] | None, tools: tuple[ToolSpec, ...]) -> tuple[ToolChoice, str | None]:
    """(choice, function name) for `tool_choice`; the default is auto with tools, none without."""
    if choice is None:
        return (ToolChoice.AUTO if tools else ToolChoice.NONE), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise invalid(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}.", "tool_choice")
        if choice != "none" and not tools:
            raise invalid(f"tool_choice={choice!r} needs 'tools'.", "tool_choice")
        return ToolChoice(choice), None
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise invalid('A named tool_choice must be {"type": "function", "function": {"name": ...}}.', "tool_choice")
    if name not in {t.name for t in tools}:
        raise invalid(f"tool_choice names the function {name!r}, which is not in 'tools'.", "tool_choice")
    return ToolChoice.NAMED, name


def tool_call_schema(
    tools: tuple[ToolSpec, ...], choice: ToolChoice, name: str | None, parallel: bool = True
) -> StructuredSpec | None:
    """The JSON schema that enforces `required` (one call unless `parallel`) or a named function;
    None for none/auto."""
    if choice is ToolChoice.NAMED:
        tool = next(t for t in tools if t.name == name)
        return StructuredSpec(GuideKind.JSON, json.dumps(tool.parameters))
    if choice is not ToolChoice.REQUIRED:
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t.name]}, "parameters": t.parameters},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        array["maxItems"] = 1
    return StructuredSpec(GuideKind.JSON, json.dumps(array))
