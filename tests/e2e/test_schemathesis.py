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
