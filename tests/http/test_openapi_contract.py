"""Issue 14 item 4: an OpenAPI that generators and testers like — a readable,
stable operation ID on every operation (never FastAPI's generated ones),
links from the answers that carry an ID to the operations that take it, and
an `Allow` on a 405 that lists exactly the documented methods of the path."""

from __future__ import annotations

import re

import pytest

from app.api.app import create_app
from app.api.openapi import LINKS, OPERATION_IDS
from app.settings import Settings
from tests.http.helpers import assert_error

SCHEMA = create_app(Settings(database_url="postgresql://unused/none", workflows="")).openapi()
OPERATIONS = {(method, path): op for path, ops in SCHEMA["paths"].items()
              for method, op in ops.items()}


def test_every_operation_has_a_readable_unique_operation_id() -> None:
    ids = [op["operationId"] for op in OPERATIONS.values()]
    assert all(re.fullmatch(r"[a-z][A-Za-z]+", i) for i in ids), ids
    assert len(ids) == len(set(ids)), ids
    # Every operation is named in the table, and the table names nothing stale.
    assert set(OPERATION_IDS) == set(OPERATIONS), (
        set(OPERATIONS) ^ set(OPERATION_IDS))


def test_links_lead_to_operations_that_take_the_linked_parameter() -> None:
    by_id = {op["operationId"]: (path, op) for (_, path), op in OPERATIONS.items()}
    linked = 0
    for (source, status), (_, parameter, targets) in LINKS.items():
        _, op = by_id[source]
        links = op["responses"][status]["links"]
        assert {link["operationId"] for link in links.values()} == set(targets)
        for link in links.values():
            path, target = by_id[link["operationId"]]
            names = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
            assert set(link["parameters"]) == {parameter} <= names, (source, link)
            linked += 1
    assert linked >= 20, linked


@pytest.mark.parametrize("path", sorted(SCHEMA["paths"]))
async def test_a_405_allows_exactly_the_documented_methods(client, path) -> None:
    documented = sorted(m.upper() for m in SCHEMA["paths"][path])
    concrete = re.sub(r"\{[^}]+\}", "x1", path)
    wrong = next(m for m in ("PUT", "PATCH", "DELETE", "POST", "GET") if m not in documented)
    r = await client.request(wrong, concrete)
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"].split(", ") == documented, (path, r.headers["allow"])
