"""Resolve with bad input (issue 4, "Bad input"), and the history routes:
events, steps (values only when asked), late observations."""

from __future__ import annotations

import json
import os

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.history import event_count
from tests.support.responses import assert_error

pytestmark = pytest.mark.timeout(60)


async def parked_effect(store: ExecutionStore, eid: str) -> None:
    """An execution parked with step `charge` outcome_unknown (and step `before` recorded)."""
    await admit(store, "op-charge", eid, {"recovery": "neither"})
    [d] = await store.leases.claim_due(1, 30, "w", ["op-charge"])
    await store.steps.write_step(d.lease, "before", value={"ok": True}, function_name="f")
    await store.effects.begin_effect(d.lease, "charge", idempotency_key=f"{eid}:charge",
                             function_name="remote_charge")
    await store.effects.park_outcome_unknown(d.lease, "charge")


async def snapshot(pool: asyncpg.Pool, eid: str) -> tuple:
    rec = await pool.fetchrow("SELECT * FROM executions WHERE execution_id = $1", eid)
    effects = await pool.fetch("SELECT * FROM effects WHERE execution_id = $1", eid)
    steps = await pool.fetch("SELECT * FROM execution_steps WHERE execution_id = $1", eid)
    events = await pool.fetchval("SELECT count(*) FROM execution_events")
    return dict(rec), [dict(r) for r in effects], [dict(r) for r in steps], events


MALFORMED = [
    {"action": "refund"},                                              # unknown action
    {"action": "SUCCEED", "result": 1},
    {},                                                                # no action
    {"action": "fail"},                                                # fail without error
    {"action": "fail", "error": None},
    {"action": "fail", "error": {"message": "no name"}},
    {"action": "fail", "error": {"name": ""}},
    {"action": "fail", "error": {"name": "E", "message": "m", "stack": "extra"}},
    {"action": "fail", "error": "declined"},
    {"action": "fail", "error": {"name": "E"}, "result": 1},           # result with fail
    {"action": "succeed", "result": 1, "error": {"name": "E"}},        # error with succeed
    {"action": "retry", "error": {"name": "E"}},
    {"action": "retry", "result": {"x": 1}},                           # result with retry
    {"action": "succeed", "result": 1, "comment": "extra field"},      # extra fields
    {"action": "succeed", "result": 1, "by": "x" * 201},
    [],
    "succeed",
    None,
]


async def test_malformed_resolutions_are_422_and_change_nothing(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = "resolve-bad"
    await parked_effect(store, eid)
    before = await snapshot(pool, eid)
    for body in MALFORMED:
        r = await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                           content=json.dumps(body), headers={"content-type": "application/json"})
        assert_error(r, 422, "INVALID_RESOLUTION")
    # A result jsonb cannot hold is refused by the body rule every route shares.
    r = await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                       json={"action": "succeed", "result": "nul\u0000"})
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await snapshot(pool, eid) == before

    # Still resolvable, once.
    r = await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                       json={"action": "succeed", "result": None})
    assert r.status_code == 200 and r.json() == {"status": "admitted"}, r.text
    steps = await store.history.steps([eid])
    assert steps[eid]["charge"].status == "completed" and steps[eid]["charge"].value is None
    n = await event_count(store)
    err = assert_error(await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                                      json={"action": "retry"}), 409, "STEP_NOT_OUTCOME_UNKNOWN")
    assert err["status"] == "admitted", err
    assert await event_count(store) == n


async def test_resolve_on_a_step_that_is_not_outcome_unknown_is_409_unknown_404(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = "resolve-wrong-step"
    await parked_effect(store, eid)
    other = await admit(store, "op-quick", "resolve-not-parked")
    before = await snapshot(pool, eid)
    n = await event_count(store)
    # A recorded step is 409; a key the execution never had is 404 (issue 19).
    for key, status, code in (("before", 409, "STEP_NOT_OUTCOME_UNKNOWN"),
                              ("no-such-step", 404, "STEP_NOT_FOUND")):
        err = assert_error(await api.post(f"/v1/executions/{eid}/steps/{key}/resolve",
                                          json={"action": "retry"}), status, code)
        assert err["status"] == "parked", err
    err = assert_error(await api.post(f"/v1/executions/{other}/steps/charge/resolve",
                                      json={"action": "succeed", "result": 1}),
                       404, "STEP_NOT_FOUND")
    assert err["status"] == "admitted", err
    assert_error(await api.post("/v1/executions/nope/steps/charge/resolve",
                                json={"action": "retry"}), 404, "EXECUTION_NOT_FOUND")
    assert await snapshot(pool, eid) == before and await event_count(store) == n


async def test_history_routes_answer_404_for_unknown_executions(api: httpx.AsyncClient) -> None:
    for route in ("events", "steps", "late-observations"):
        assert_error(await api.get(f"/v1/executions/nope/{route}"), 404, "EXECUTION_NOT_FOUND")


async def test_steps_omit_values_unless_asked_and_show_attempts_in_doubt(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    eid = "history-steps"
    await parked_effect(store, eid)
    big = {"blob": os.urandom(2500).hex()}  # incompressible
    # A second delivery's worth of steps, on another execution.
    eid2 = await admit(store, "op-quick", "history-values")
    [d] = await store.leases.claim_due(1, 30, "w", ["op-quick"])
    await store.steps.write_step(d.lease, "big", value=big, function_name="f")
    await store.steps.write_step(d.lease, "bad", error={"name": "Declined", "message": "no"},
                           function_name="g", attempts=3)
    await store.leases.acknowledge(d.lease, "completed", result={})

    steps = (await api.get(f"/v1/executions/{eid2}/steps")).json()["steps"]
    assert [s["stepKey"] for s in steps] == ["big", "bad"], steps
    for s in steps:
        assert "result" not in s and "error" not in s, s
        assert s["token"] == 1 and s["recordedAt"], s
    assert steps[0]["valueBytes"] > 1000 and steps[0]["status"] == "completed"
    assert (steps[1]["status"], steps[1]["attempts"], steps[1]["errorName"], steps[1]["function"]
            ) == ("failed", 3, "Declined", "g")

    full = (await api.get(f"/v1/executions/{eid2}/steps",
                          params={"includeValues": "true"})).json()["steps"]
    assert full[0]["result"] == big and full[0]["error"] is None
    assert full[1]["error"] == {"name": "Declined", "message": "no"} and full[1]["result"] is None

    doubt = (await api.get(f"/v1/executions/{eid}/steps")).json()["steps"]
    assert [(s["stepKey"], s["status"]) for s in doubt] == [
        ("before", "completed"), ("charge", "outcome_unknown")], doubt
    assert doubt[1]["idempotencyKey"] == f"{eid}:charge" and doubt[1]["startedAt"], doubt


@pytest.mark.citus  # the events' order: each drawn on the execution's node
async def test_events_and_late_observations(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "history-events")
    [a] = await store.leases.claim_due(1, 30, "A")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)
    [b] = await store.leases.claim_due(1, 30, "B")
    await store.steps.write_step(b.lease, "one", value=1, function_name="f")
    await store.leases.acknowledge(b.lease, "completed", result={"one": 1})
    assert (await api.get(f"/v1/executions/{eid}/late-observations")).json() == {
        "lateObservations": [], "nextAfter": None}
    await store.steps.record_late_observation(a.lease, "one", value={"late": True})

    events = (await api.get(f"/v1/executions/{eid}/events")).json()
    assert events["nextAfter"] is None
    got = [(e["kind"], e["token"]) for e in events["events"]]
    # A's late {"late": true} differs from the recorded 1: an integrity conflict.
    assert got == [("admitted", None), ("claimed", 1), ("lease_expired", 1), ("claimed", 2),
                   ("step_recorded", 2), ("acknowledged", 2), ("integrity_conflict", 1)], got
    assert events["events"][1]["detail"] == {"owner": "A"}
    assert events["events"][2]["detail"]["owner"] == "A"

    page1 = (await api.get(f"/v1/executions/{eid}/events", params={"limit": 4})).json()
    assert len(page1["events"]) == 4 and page1["nextAfter"] == page1["events"][-1]["eventId"]
    page2 = (await api.get(f"/v1/executions/{eid}/events",
                           params={"after": page1["nextAfter"], "limit": 4})).json()
    assert page1["events"] + page2["events"] == events["events"] and page2["nextAfter"] is None
    # Each event's place in the history grows along it; `after` is an event's
    # ID (continue after its place) or any number (after the last lower ID).
    places = [e["sequence"] for e in events["events"]]
    assert places == sorted(set(places)), places
    last = events["events"][-1]["eventId"]
    assert (await api.get(f"/v1/executions/{eid}/events",
                          params={"after": last + 10**6})).json()["events"] == []

    [late] = (await api.get(f"/v1/executions/{eid}/late-observations")).json()["lateObservations"]
    assert (late["stepKey"], late["token"], late["owner"], late["value"]) == (
        "one", 1, "A", {"late": True}), late
    # Evidence only: the step and the outcome are B's.
    steps = (await api.get(f"/v1/executions/{eid}/steps",
                           params={"includeValues": "true"})).json()["steps"]
    assert [(s["stepKey"], s["token"], s["result"]) for s in steps] == [("one", 2, 1)]
    assert (await store.history.get(eid))["outcome"] == {"result": {"one": 1}}
