"""schemathesis against the gateway's OpenAPI schema, on a real mesh: 0 server errors."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 40


def test_no_server_errors(mesh):
    schema = schemathesis.openapi.from_url(f"{mesh.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    calls = 0
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            nonlocal calls
            # NOTE: bound generation so each fuzzed request stays quick on the tiny model.
            if isinstance(case.body, dict) and isinstance(case.body.get("max_tokens"), int):
                case.body["max_tokens"] = min(case.body["max_tokens"], 8)
            case.call_and_validate(checks=[not_a_server_error], timeout=60)
            calls += 1

        run()
    assert calls >= EXAMPLES_PER_OPERATION


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BAD_VALUES = [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "invalid json for structured output"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/completions", {"n": 1000}, "n must be between 1 and"),
    ("/v1/completions", {"logit_bias": {"999999": 10}}, "outside the vocabulary"),
    ("/v1/completions", {"priority": "high"}, "priority"),
    ("/v1/completions", {"guided_grammar": "root ::= "}, "invalid grammar for structured output"),
]


@pytest.mark.parametrize(("path", "extra", "says"), BAD_VALUES)
def test_bad_values_are_400_in_openai_error_json(mesh, path, extra, says):
    schema = schemathesis.openapi.from_url(f"{mesh.base_url}/openapi.json")
    body = {"model": "tiny", "max_tokens": 4} | (
        {"messages": [{"role": "user", "content": "hi"}]} if path.endswith("chat/completions") else {"prompt": "hi"}
    ) | extra
    case = schema[path]["POST"].Case(body=body, media_type="application/json")
    response = case.call_and_validate(checks=[not_a_server_error], timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error"
    assert says in error["message"] or says == error["param"]
