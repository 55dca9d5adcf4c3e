"""The published OpenAPI schema: FastAPI's, with two corrections so that it
says exactly what the API does (schemathesis holds it to that, see
tests/hostile):

- FastAPI documents a 422 `HTTPValidationError` ({"detail": [...]}) on every
  route with parameters. This API answers validation errors in the one error
  shape, and documents 422 with `ErrorBody` on each route that can produce
  one; the generated entries are removed (on a route whose only parameter is
  an unconstrained path string no 422 can happen at all).
- Authentication: a bearer security scheme, required by every operation that
  documents 401.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

_GENERATED_422 = "#/components/schemas/HTTPValidationError"
_SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API token (fp_<id>_<secret>) from "
    "`fencepost tokens create --role trigger|read|operate --name NAME`.",
}


def _refers_to(node: Any, ref: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == ref or any(_refers_to(v, ref) for v in node.values())
    if isinstance(node, list):
        return any(_refers_to(v, ref) for v in node)
    return False


def tidy(schema: dict) -> dict:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if _refers_to(responses.get("422"), _GENERATED_422):
                del responses["422"]
            if "401" in responses:
                operation["security"] = [{"bearer": []}]
    components = schema.setdefault("components", {})
    schemas = components.get("schemas", {})
    if not _refers_to(schema.get("paths"), _GENERATED_422):
        schemas.pop("HTTPValidationError", None)
        if not _refers_to({**schema.get("paths", {}), **schemas},
                          "#/components/schemas/ValidationError"):
            schemas.pop("ValidationError", None)
    components.setdefault("securitySchemes", {})["bearer"] = _SECURITY_SCHEME
    return schema


def publish(app: FastAPI) -> None:
    """Make `app.openapi()` (and /openapi.json, /docs) serve the tidied schema."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = tidy(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
