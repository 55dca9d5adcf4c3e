"""Issue 19 item 6: admission. A deadline at or before now (database clock) is
422 DEADLINE_IN_THE_PAST with nothing stored; a malformed request is 422
INVALID_REQUEST; INVALID_EXECUTION_EVENT keeps meaning "a value that cannot
round-trip" (NaN, NUL, lone surrogates, duplicate keys, too deep)."""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import httpx
import pytest

from tests.operator import conftest as operator_fixtures
from tests.support.admission import admit_api
from tests.support.responses import assert_error

pytestmark = pytest.mark.timeout(60)

op_settings = operator_fixtures.op_settings
store_settings = operator_fixtures.store_settings  # the `store` fixture uses these
api = operator_fixtures.api


async def nothing_stored(pool: asyncpg.Pool) -> bool:
    return await pool.fetchval(
        "SELECT (SELECT count(*) FROM executions) + (SELECT count(*) FROM execution_events)"
    ) == 0


async def test_a_deadline_at_or_before_now_is_422_and_nothing_is_stored(
        pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    now = await pool.fetchval("SELECT now()")  # the database clock, before the request
    for i, deadline in enumerate((now, now - timedelta(milliseconds=1),
                                  now - timedelta(days=400))):
        r = await admit_api(api, "op-quick", f"past-{i}", deadline=deadline.isoformat())
        err = assert_error(r, 422, "DEADLINE_IN_THE_PAST")
        assert "deadline" in err["message"] and "timeoutSeconds" in err["message"], err
    r = await admit_api(api, "op-quick", "past-z", deadline="2001-01-01T00:00:00+05:00")
    assert_error(r, 422, "DEADLINE_IN_THE_PAST")
    assert await nothing_stored(pool)

    # Later than now by the database clock: admitted, with that deadline.
    future = await pool.fetchval("SELECT now() + interval '1 hour'")
    r = await admit_api(api, "op-quick", "future", deadline=future.isoformat())
    assert r.status_code == 201, r.text
    assert await pool.fetchval("SELECT deadline FROM executions WHERE execution_id = 'future'"
                               ) == future


MALFORMED = {
    "body-array": "[]",
    "body-null": "null",
    "body-number": "42",
    "empty-object": "{}",
    "unknown-field": json.dumps({"workflowId": "op-quick", "params": {}, "extra": 1}),
    "bad-workflow-id": json.dumps({"workflowId": "not valid", "params": {}}),
    "bad-execution-id": json.dumps({"workflowId": "op-quick", "executionId": "a/b"}),
    "context-list": json.dumps({"workflowId": "op-quick", "context": [1]}),
    "deadline-not-a-time": json.dumps({"workflowId": "op-quick", "deadline": "tomorrow"}),
    "deadline-without-offset": json.dumps({"workflowId": "op-quick",
                                           "deadline": "2099-01-01T00:00:00"}),
    "deadline-and-timeout": json.dumps({"workflowId": "op-quick", "timeoutSeconds": 5,
                                        "deadline": "2099-01-01T00:00:00Z"}),
    "timeout-zero": json.dumps({"workflowId": "op-quick", "timeoutSeconds": 0}),
    "timeout-string": json.dumps({"workflowId": "op-quick", "timeoutSeconds": "5"}),
}

UNSTORABLE = {
    "nan": '{"workflowId":"op-quick","params":{"x":NaN}}',
    "nul": '{"workflowId":"op-quick","params":{"s":"a\\u0000b"}}',
    "lone-surrogate": '{"workflowId":"op-quick","context":{"k":"\\ud800"}}',
    "duplicate-key": '{"workflowId":"op-quick","params":{"a":1,"a":2}}',
    "too-deep": '{"workflowId":"op-quick","params":' + "[" * 70 + "]" * 70 + "}",
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_admissions_are_invalid_request(
        pool: asyncpg.Pool, api: httpx.AsyncClient, body: str) -> None:
    r = await api.post("/v1/executions", content=body,
                       headers={"content-type": "application/json"})
    assert_error(r, 422, "INVALID_REQUEST")
    assert await nothing_stored(pool)


@pytest.mark.parametrize("body", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
async def test_values_that_cannot_round_trip_stay_invalid_execution_event(
        pool: asyncpg.Pool, api: httpx.AsyncClient, body: str) -> None:
    r = await api.post("/v1/executions", content=body,
                       headers={"content-type": "application/json"})
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await nothing_stored(pool)
