"""OpenAPI request-body schemas for the routes that parse their body themselves.

The handlers read the raw body (so malformed JSON becomes an OpenAI error, not FastAPI's 422);
this puts the pydantic bodies back into /openapi.json for clients and schema-driven fuzzers.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from .protocol import ChatBody, CompletionBody
from .tokenize import DetokenizeBody, TokenizeBody

REF = "#/components/schemas/{model}"


def request_body(model: type) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install(app: FastAPI) -> None:
    """Adds the body models to the app's OpenAPI components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            bodies = (CompletionBody, ChatBody, TokenizeBody, DetokenizeBody)
            _, defs = models_json_schema([(b, "validation") for b in bodies], ref_template=REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
