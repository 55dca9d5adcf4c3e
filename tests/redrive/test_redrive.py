"""Issue 13 items 1 and 2: redrive in place and fork. In-process workers and
API on a real Postgres; each test written before the code it exercises."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest

from app.store import ExecutionStore, LeaseLost
from tests.redrive import flows
from tests.support.admission import admit
from tests.support.history import events_of
from tests.support.races import RowLock, until_waiting
from tests.support.responses import assert_error, get_record, post_raw
from tests.support.waiting import wait_status, wait_until

pytestmark = pytest.mark.timeout(60)


async def steps_of(api: httpx.AsyncClient, eid: str) -> list[dict]:
    r = await api.get(f"/v1/executions/{eid}/steps", params={"includeValues": "true"})
    assert r.status_code == 200, r.text
    return r.json()["steps"]


@pytest.mark.citus
async def test_a_failed_execution_redriven_after_the_fix_completes_and_runs_nothing_twice(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "rd-order", "ship-1")
    failed = await wait_status(store, eid, "failed")
    assert failed["outcome"]["error"]["name"] == "StepFailed", failed
    key_before = [s for s in await steps_of(api, eid) if s["stepKey"] == "charge"][0]

    flows.FIXED.add(eid)
    r = await api.post(f"/v1/executions/{eid}/redrive",
                       json={"reason": "warehouse back", "by": "alice"})
    assert r.status_code == 202, r.text
    assert r.json() == {"executionId": eid, "status": "admitted", "redrive": 1,
                        "superseded": ["ship"]}
    done = await wait_status(store, eid, "completed")
    assert done["outcome"]["result"]["ship"] == "shipped"

    # Over the whole life: reserve and charge ran once, ship twice.
    assert (flows.calls(eid, "reserve"), flows.calls(eid, "charge"),
            flows.calls(eid, "ship")) == (1, 1, 2)
    steps = await steps_of(api, eid)
    charge = [s for s in steps if s["stepKey"] == "charge"][0]
    assert charge["idempotencyKey"] == key_before["idempotencyKey"] == f"{eid}:charge"
    superseded = [s for s in steps if s["status"] == "superseded"]
    assert [(s["stepKey"], s["errorName"]) for s in superseded] == [("ship", "LookupError")]
    assert superseded[0]["supersededAt"] is not None and superseded[0]["redrive"] == 1
    [event] = await events_of(store, eid, "redriven")
    assert event["detail"] == {"by": "alice", "reason": "warehouse back", "redrive": 1,
                               "superseded": ["ship"]}, event


@pytest.mark.citus
async def test_a_redriven_effect_is_called_again_with_the_same_idempotency_key(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "rd-order", "card-1")
    await wait_status(store, eid, "failed")
    assert flows.KEYS[eid] == [f"{eid}:charge"]

    flows.FIXED.add(eid)
    r = await api.post(f"/v1/executions/{eid}/redrive")
    assert r.status_code == 202 and r.json()["superseded"] == ["charge"], r.text
    await wait_status(store, eid, "completed")
    assert flows.KEYS[eid] == [f"{eid}:charge", f"{eid}:charge"]
    assert flows.calls(eid, "reserve") == 1
    # The superseded attempt and the new step show the same request identity.
    keys = {(s["status"], s["idempotencyKey"]) for s in await steps_of(api, eid)
            if s["stepKey"] == "charge"}
    assert keys == {("superseded", f"{eid}:charge"), ("completed", f"{eid}:charge")}, keys


@pytest.mark.citus
async def test_from_step_on_a_completed_execution_reruns_exactly_the_steps_from_there(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "rd-order", "done-1")
    await wait_status(store, eid, "completed")
    assert_error(await api.post(f"/v1/executions/{eid}/redrive"), 409, "REDRIVE_NEEDS_FROM_STEP")
    assert_error(await api.post(f"/v1/executions/{eid}/redrive", json={"fromStep": "nope"}),
                 422, "STEP_NOT_FOUND")

    r = await api.post(f"/v1/executions/{eid}/redrive",
                       json={"fromStep": "charge", "timeoutSeconds": 600})
    assert r.status_code == 202 and r.json()["superseded"] == ["charge", "ship"], r.text
    rec = await wait_status(store, eid, "completed")
    assert rec["deadline"] is not None
    assert (flows.calls(eid, "reserve"), flows.calls(eid, "charge"),
            flows.calls(eid, "ship")) == (1, 2, 2)
    assert flows.KEYS[eid] == [f"{eid}:charge"] * 2


@pytest.mark.citus
async def test_a_cancelled_execution_redriven_runs_its_wait_again_not_its_cleanup(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "rd-approval", "appr-1")
    await wait_status(store, eid, "suspended")
    await store.operator.request_cancel(eid, "ops")
    await wait_status(store, eid, "cancelled")
    assert flows.calls(eid, "release") == 1

    r = await api.post(f"/v1/executions/{eid}/redrive")
    assert r.status_code == 202 and r.json()["superseded"] == ["release"], r.text

    async def waiting() -> dict | None:
        rec = await get_record(api, eid)
        return rec if (rec["blockedBy"] or {}).get("reason") == "waiting-for-signal" else None

    rec = await wait_until(waiting, timeout=10, what="waiting for the decision again")
    assert rec["cancelRequestedAt"] is None and rec["token"] == 3, rec
    answer, _ = await store.signals.send_signal(eid, "decision", "yes")
    assert answer == "received"
    done = await wait_status(store, eid, "completed")
    assert done["outcome"]["result"] == "decided yes"
    assert (flows.calls(eid, "reserve"), flows.calls(eid, "release")) == (1, 1)


@pytest.mark.citus
async def test_redrive_refuses_what_has_not_ended_and_changes_nothing(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "rd-order", "not-ended")
    err = assert_error(await api.post(f"/v1/executions/{eid}/redrive"), 409,
                       "EXECUTION_NOT_ENDED")
    assert "admitted" in err["message"]
    assert_error(await api.post("/v1/executions/ghost/redrive"), 404, "EXECUTION_NOT_FOUND")
    assert_error(await api.post(f"/v1/executions/{eid}/redrive", json={"fromStep": 5}), 422,
                 "INVALID_REQUEST")
    assert_error(await api.post(f"/v1/executions/{eid}/redrive",
                                json={"deadline": "2001-01-01T00:00:00Z"}), 422,
                 "DEADLINE_IN_THE_PAST")
    assert await events_of(store, eid, "redriven") == []


@pytest.mark.citus
async def test_a_redrive_deadline_beyond_the_years_utc_holds_is_passed_or_the_latest(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    """A deadline whose offset puts it before year 1 in UTC has passed; one
    after 9999 is the latest time stored (9999-12-31 UTC). A fork's params
    Postgres cannot store exactly are refused the same way as anywhere."""
    eid = await admit(store, "rd-order", "far-1")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.steps.write_step(d.lease, "reserve", value="held")
    await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})

    assert_error(await api.post(f"/v1/executions/{eid}/redrive",
                                json={"deadline": "0001-01-01T00:00:00+05:00"}), 422,
                 "DEADLINE_IN_THE_PAST")
    assert await events_of(store, eid, "redriven") == []
    r = await api.post(f"/v1/executions/{eid}/redrive",
                       json={"deadline": "9999-12-31T23:30:00-01:00"})
    assert r.status_code == 202, r.text
    rec = await store.history.get(eid)
    assert rec["deadline"] == datetime(9999, 12, 31, tzinfo=UTC), rec["deadline"]

    r = await post_raw(api, b'{"fromStep":"reserve","params":{"n":1e16}}',
                       f"/v1/executions/{eid}/fork")
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await store.pool.fetchval("SELECT count(*) FROM executions") == 1


# Not on Citus: RowLock holds the row with a statement Citus cannot route.
async def test_two_redrives_at_once_make_one(store: ExecutionStore, pool) -> None:
    eid = await admit(store, "rd-order", "race-1")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})
    # Both queue on the row (a third connection holds it), then go at once.
    async with RowLock(pool, eid):
        first = asyncio.create_task(store.redrives.redrive(eid, "a"))
        await until_waiting(pool, 1, what="the first redrive", also=first.done)
        second = asyncio.create_task(store.redrives.redrive(eid, "b"))
        await until_waiting(pool, 2, what="the second redrive", also=second.done)
    answers = sorted([(await first)[0], (await second)[0]])
    assert answers == ["not_ended", "redriven"], answers
    assert len(await events_of(store, eid, "redriven")) == 1
    assert (await store.history.get(eid))["redrives"] == 1


@pytest.mark.citus
async def test_a_stale_holder_stays_fenced_out_across_a_redrive(store: ExecutionStore) -> None:
    eid = await admit(store, "rd-order", "stale-1")
    [d] = await store.leases.claim_due(1, 30, "w1")
    stale = d.lease
    assert await store.operator.terminate(eid, "ops") == ("cancelled", "cancelled")
    answer, redriven = await store.redrives.redrive(eid, "ops")
    assert answer == "redriven" and redriven.status == "admitted"

    # Between the redrive and the next claim, and after it: nothing of the
    # old holder lands.
    with pytest.raises(LeaseLost):
        await store.steps.write_step(stale, "reserve", value="x", function_name="reserve", attempts=1)
    [fresh] = await store.leases.claim_due(1, 30, "w2")
    assert fresh.lease.token == stale.token + 1
    with pytest.raises(LeaseLost):
        await store.steps.write_step(stale, "reserve", value="x", function_name="reserve", attempts=1)
    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(stale, "completed", result=1)
    renewed, lost = await store.leases.renew([stale], 30)
    assert renewed == [] and lost == [stale]
    assert (await store.history.get(eid))["status"] == "running"


@pytest.mark.citus
async def test_a_fork_copies_exactly_the_steps_before_from_step(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "rd-order", "src-1")
    await wait_status(store, eid, "completed")

    r = await api.post(f"/v1/executions/{eid}/fork",
                       json={"fromStep": "ship", "executionId": "fork-1",
                             "params": {"note": "again"}})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/executions/fork-1"
    assert r.json() == {"executionId": "fork-1", "status": "admitted", "forkedFrom": eid,
                        "copied": ["reserve", "charge"]}
    done = await wait_status(store, "fork-1", "completed")
    assert done["outcome"]["result"]["note"] == "again"
    assert done["forked_from"] == eid
    # Only ship ran in the fork; the copied effect kept its request identity.
    assert [step for e, step in flows.CALLS if e == "fork-1"] == ["ship"]
    charge = [s for s in await steps_of(api, "fork-1") if s["stepKey"] == "charge"][0]
    assert charge["idempotencyKey"] == f"{eid}:charge"
    [forked] = await events_of(store, eid, "forked")
    assert forked["detail"]["executionId"] == "fork-1"

    # The default ID is derived (a client cannot take it); a taken ID is 409.
    r = await api.post(f"/v1/executions/{eid}/fork", json={"fromStep": "reserve"})
    assert r.status_code == 201 and r.json()["executionId"].startswith(f"{eid}~fork-"), r.text
    assert r.json()["copied"] == []
    assert_error(await api.post(f"/v1/executions/{eid}/fork",
                                json={"fromStep": "ship", "executionId": "fork-1"}),
                 409, "EXECUTION_ID_CONFLICT")
    assert_error(await api.post(f"/v1/executions/{eid}/fork",
                                json={"fromStep": "ship", "executionId": "a~b"}),
                 422, "RESERVED_EXECUTION_ID")
    assert_error(await api.post(f"/v1/executions/{eid}/fork", json={"fromStep": "nope"}),
                 422, "STEP_NOT_FOUND")
    assert_error(await api.post(f"/v1/executions/{eid}/fork", json={}), 422, "INVALID_REQUEST")
