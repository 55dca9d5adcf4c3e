"""Issue 19 item 3: resolutions record a value. `succeed` needs `result` (an
explicit null is a value), `fail` needs `error`; the decided value and the
decider are in the `resolved` event; a step the execution never had is 404."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.operator import conftest as operator_fixtures
from tests.operator.test_resolve_and_history import parked_effect, snapshot
from tests.support.history import event_count, events_of
from tests.support.responses import assert_error

pytestmark = pytest.mark.timeout(60)

# The operator suite's fixtures: short timings, an in-process API, the store's settings.
op_settings = operator_fixtures.op_settings
store_settings = operator_fixtures.store_settings  # the `store` fixture uses these
api = operator_fixtures.api


async def test_succeed_without_result_is_422_and_changes_nothing(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = "res-no-result"
    await parked_effect(store, eid)
    before = await snapshot(pool, eid)
    err = assert_error(await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                                      json={"action": "succeed"}), 422, "INVALID_RESOLUTION")
    assert '"result"' in err["message"], err
    assert await snapshot(pool, eid) == before


@pytest.mark.parametrize("value", [None, {"charge": "ch_1", "amount": 12}, 0, ""])
async def test_succeed_records_the_value_and_the_decider_in_the_event(
        store: ExecutionStore, api: httpx.AsyncClient, value) -> None:
    # Each parametrized case has its own database (one parked execution).
    eid = "res-value"
    await parked_effect(store, eid)
    r = await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                       json={"action": "succeed", "result": value, "by": "alice"})
    assert r.status_code == 200, r.text
    [ev] = await events_of(store, eid, "resolved")
    assert ev["detail"] == {"stepKey": "charge", "action": "succeed", "by": "alice",
                            "result": value}, ev
    steps = await store.history.steps([eid])
    assert steps[eid]["charge"].status == "completed"
    assert steps[eid]["charge"].value == value


async def test_fail_records_the_error_and_the_decider(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await parked_effect(store, "res-fail")
    r = await api.post("/v1/executions/res-fail/steps/charge/resolve",
                       json={"action": "fail", "by": "bob",
                             "error": {"name": "Declined", "message": "card declined"}})
    assert r.status_code == 200, r.text
    [ev] = await events_of(store, "res-fail", "resolved")
    assert ev["detail"] == {"stepKey": "charge", "action": "fail", "by": "bob",
                            "error": {"name": "Declined", "message": "card declined"}}, ev


async def test_retry_records_the_decider_and_no_value(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await parked_effect(store, "res-retry")
    r = await api.post("/v1/executions/res-retry/steps/charge/resolve", json={"action": "retry"})
    assert r.status_code == 200, r.text
    [ev] = await events_of(store, "res-retry", "resolved")
    assert set(ev["detail"]) == {"stepKey", "action", "by"}, ev  # nothing decided but retry
    assert ev["detail"]["action"] == "retry"


async def test_unknown_step_is_404_a_known_settled_step_409(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = "res-unknown"
    await parked_effect(store, eid)
    before = await snapshot(pool, eid)
    n = await event_count(store)
    err = assert_error(await api.post(f"/v1/executions/{eid}/steps/no-such-step/resolve",
                                      json={"action": "retry"}), 404, "STEP_NOT_FOUND")
    assert "no-such-step" in err["message"], err
    err = assert_error(await api.post(f"/v1/executions/{eid}/steps/before/resolve",
                                      json={"action": "retry"}), 409, "STEP_NOT_OUTCOME_UNKNOWN")
    assert err["status"] == "parked"
    assert_error(await api.post("/v1/executions/nope/steps/charge/resolve",
                                json={"action": "retry"}), 404, "EXECUTION_NOT_FOUND")
    assert await snapshot(pool, eid) == before and await event_count(store) == n
