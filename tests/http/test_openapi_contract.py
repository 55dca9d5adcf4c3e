"""Issue 14 item 4: an OpenAPI that generators and testers like — a readable,
stable operation ID on every operation (never FastAPI's generated ones),
links from the answers that carry an ID to the operations that take it, and
an `Allow` on a 405 that lists exactly the documented methods of the path,
and the rules the server holds a request body to stated in the schema."""

from __future__ import annotations

import re
from zoneinfo import available_timezones

import jsonschema_rs
import pytest

from app import cron
from app.api.app import create_app
from app.api.openapi import CRON_PATTERN, LINKS, OPERATION_IDS, TIMEZONE_PATTERN
from app.settings import Settings
from tests.support.responses import assert_error

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


# The rules a request body is held to beyond its fields' types are stated in
# the schema (app/api/openapi.py STATED_RULES): a request the schema calls
# valid is not refused for a reason it hides, and one it calls invalid is refused.


def _body_validator(operation_id: str) -> jsonschema_rs.Draft202012Validator:
    [op] = [op for op in OPERATIONS.values() if op["operationId"] == operation_id]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**schema, "components": SCHEMA["components"]})


@pytest.mark.parametrize(("body", "valid"), [
    ({"workflowId": "w", "timeoutSeconds": 60}, True),
    ({"workflowId": "w", "deadline": "2999-01-01T00:00:00Z"}, True),
    ({"workflowId": "w", "deadline": None, "timeoutSeconds": 60}, True),
    ({"workflowId": "w", "deadline": "2999-01-01T00:00:00Z", "timeoutSeconds": 60}, False),
])
def test_admission_states_deadline_or_timeout_not_both(body, valid) -> None:
    assert _body_validator("admitExecution").is_valid(body) is valid


@pytest.mark.parametrize(("body", "valid"), [
    ({"action": "retry"}, True),
    ({"action": "succeed", "result": None}, True),
    ({"action": "fail", "error": {"name": "E", "message": "m"}}, True),
    ({"action": "succeed"}, False),
    ({"action": "retry", "result": 1}, False),
    ({"action": "fail"}, False),
    ({"action": "retry", "error": {"name": "E", "message": "m"}}, False),
])
def test_a_resolution_states_which_fields_go_with_which_action(body, valid) -> None:
    assert _body_validator("resolveStep").is_valid(body) is valid


@pytest.mark.parametrize(("body", "valid"), [
    ({"action": "cancel", "filter": {"workflowId": "w"}}, True),
    ({"action": "cancel", "filter": {}}, False),
    ({"action": "cancel", "filter": {"workflowId": None}}, False),
])
def test_a_bulk_operation_states_that_its_filter_names_a_condition(body, valid) -> None:
    assert _body_validator("createOperation").is_valid(body) is valid


def test_a_bulk_filter_states_its_count_bounds() -> None:
    [op] = [op for op in OPERATIONS.values() if op["operationId"] == "createOperation"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    [count] = [s for s in body["properties"]["filter"]["properties"]
               ["minUnacknowledgedDeliveries"]["anyOf"] if s.get("type") == "integer"]
    assert (count["minimum"], count["maximum"]) == (0, 2**31 - 1), count


_NOTHING = {"workflowId": "nothing-here"}


@pytest.mark.parametrize(("body", "valid"), [
    ({"action": "resolve", "filter": _NOTHING, "resolution": {"action": "fail", "error": None}},
     False),
    ({"action": "resolve", "filter": _NOTHING, "resolution": {"action": "fail"}}, False),
    ({"action": "cancel", "filter": _NOTHING, "resolution": {"action": "fail", "error": None}},
     False),
    ({"action": "resolve", "filter": _NOTHING,
      "resolution": {"action": "fail", "error": {"name": "E"}}}, True),
    ({"action": "resolve", "filter": _NOTHING, "resolution": {"action": "retry"}}, True),
    ({"action": "resolve", "filter": _NOTHING, "resolution": {"error": None}}, True),
    ({"action": "resolve", "filter": _NOTHING, "resolution": None}, True),
    ({"action": "resolve", "filter": _NOTHING}, True),
])
async def test_a_bulk_resolution_states_that_fail_needs_an_error(client, body, valid) -> None:
    """A bulk operation's resolution of `fail` records `error` (not null):
    the schema says so, and the server holds every request to it, a dry run
    included (a dry run answers what the request itself would be)."""
    assert _body_validator("createOperation").is_valid(body) is valid
    for dry_run in (True, False):
        r = await client.post("/v1/operations", json={**body, "dryRun": dry_run})
        if valid:
            assert r.status_code == (200 if dry_run else 202), (body, r.status_code, r.text)
        else:
            assert_error(r, 422, "INVALID_REQUEST")
            assert "resolution: fail needs error" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("expression", ["0 2 * * *", "*/15 * * * *", "0 9 * * MON-fri",
                                        "@daily", "0 0 1,15 */2 *", " 5 4 * * sun "])
def test_the_cron_pattern_admits_what_the_server_parses(expression) -> None:
    cron.parse(expression)
    assert re.search(CRON_PATTERN, expression), expression


@pytest.mark.parametrize("expression", ["C", "0 2 * *", "0 2 * * * *", "@every", "0;2 * * * *"])
def test_the_cron_pattern_refuses_what_the_server_cannot_parse(expression) -> None:
    with pytest.raises(cron.CronError):
        cron.parse(expression)
    assert not re.search(CRON_PATTERN, expression), expression


def test_the_timezone_pattern_admits_every_zone_the_server_knows() -> None:
    refused = [z for z in available_timezones() if not re.search(TIMEZONE_PATTERN, z)]
    assert not refused, refused
