"""POST /v1/executions/{id}/version: an execution moves to code whose replay
of its history fits, and runs there; a move the check refuses, or that the
API cannot check, changes nothing; a nondeterminism park is resumed by
moving it to code that fits. Real Postgres, real in-process workers."""

from __future__ import annotations

import json

from app.store import ExecutionStore
from tests.support.claims import claim_one
from tests.support.history import events_of
from tests.support.responses import assert_error
from tests.support.waiting import wait_record, wait_status
from tests.versions import flows
from tests.versions.conftest import admit, waiting_for_go


async def version_of(store: ExecutionStore, eid: str) -> str | None:
    record = await store.history.get(eid)
    assert record is not None
    return record["code_version"]


async def test_a_move_the_check_passes_runs_the_execution_on_the_new_code(
        api, store, workers, suspended) -> None:
    await suspended("m1")
    r = await api.post("/v1/executions/m1/version", json={"to": "2", "reason": "deploy 2"})
    assert r.status_code == 200, r.text
    assert r.json() == {"executionId": "m1", "from": "1", "to": "2", "check": "passed",
                        "status": "suspended", "resumed": False, "replayed": 1}
    assert await version_of(store, "m1") == "2"
    [moved] = await events_of(store, "m1", "version_moved")
    assert moved["detail"] == {"from": "1", "to": "2", "by": "api", "check": "passed",
                               "reason": "deploy 2"}
    # A version 1 worker no longer takes it; a version 2 worker runs it to the end.
    await workers.start(workflows=flows.V1)
    assert (await api.post("/v1/executions/m1/signals/go", json=None)).status_code == 202
    await workers.claim_rounds(2)
    assert (await store.history.get("m1"))["status"] == "suspended"
    await workers.start(workflows=flows.V2)
    done = await wait_status(store, "m1", "completed")
    assert done["outcome"] == {"result": "done-v2"}
    # Replays returned the recorded results: reserve ran once, under version 1.
    assert flows.CALLS.count(("m1", "reserve")) == 1
    assert ("m1", "notify") in flows.CALLS


async def test_a_move_the_check_refuses_changes_nothing(api_for, store, suspended) -> None:
    await suspended("m2")
    before = await store.history.events("m2")
    async with api_for(flows.V3) as api:
        r = await api.post("/v1/executions/m2/version", json={"to": "3"})
    error = assert_error(r, 409, "REPLAY_DIVERGES")
    assert error["divergence"]["position"] == 0
    assert error["divergence"]["recorded"] == "reserve"
    assert error["divergence"]["asked"] == "check"
    assert "nothing was moved" in error["message"]
    assert await version_of(store, "m2") == "1"
    assert await store.history.events("m2") == before
    assert flows.CALLS.count(("m2", "check")) == 0  # the check runs no step function


async def test_a_version_the_api_does_not_carry_needs_force(api, store, suspended) -> None:
    await suspended("m3")
    r = await api.post("/v1/executions/m3/version", json={"to": "4"})
    error = assert_error(r, 409, "REPLAY_CHECK_UNAVAILABLE")
    assert "carries version '2'" in error["message"]
    assert "fencepost replay" in error["message"] and '"force": true' in error["message"]
    assert await version_of(store, "m3") == "1"
    assert await events_of(store, "m3", "version_moved") == []

    r = await api.post("/v1/executions/m3/version", json={"to": "4", "force": True})
    assert r.status_code == 200, r.text
    assert r.json()["check"] == "skipped" and r.json()["replayed"] is None
    [moved] = await events_of(store, "m3", "version_moved")
    assert moved["detail"]["check"] == "skipped"
    # To unversioned: the API's code is version 2, so it cannot check that either.
    assert_error(await api.post("/v1/executions/m3/version", json={"to": None}), 409,
                 "REPLAY_CHECK_UNAVAILABLE")
    r = await api.post("/v1/executions/m3/version", json={"to": None, "force": True})
    assert r.status_code == 200 and r.json()["from"] == "4" and r.json()["to"] is None
    assert await version_of(store, "m3") is None


async def test_an_api_without_the_workflow_cannot_check(api_for, store) -> None:
    await admit(store, "m4")
    async with api_for({}) as api:
        r = await api.post("/v1/executions/m4/version", json={"to": "2"})
    error = assert_error(r, 409, "REPLAY_CHECK_UNAVAILABLE")
    assert "does not carry workflow 'vm-order'" in error["message"]


async def test_running_ended_and_missing_executions_are_refused(api, store, workers) -> None:
    await admit(store, "m5")
    await claim_one(store, "m5")
    error = assert_error(await api.post("/v1/executions/m5/version", json={"to": "2"}),
                         409, "EXECUTION_RUNNING")
    assert "retry when its delivery ends" in error["message"]
    assert_error(await api.post("/v1/executions/m5/version", json={"to": "2", "force": True}),
                 409, "EXECUTION_RUNNING")
    assert await version_of(store, "m5") == "1"

    await admit(store, "m6")
    assert (await api.post("/v1/executions/m6/terminate", json=None)).status_code == 202
    error = assert_error(await api.post("/v1/executions/m6/version", json={"to": "2"}),
                         409, "EXECUTION_ENDED")
    assert "cancelled" in error["message"]
    assert_error(await api.post("/v1/executions/nobody/version", json={"to": "2"}),
                 404, "EXECUTION_NOT_FOUND")


async def test_bad_bodies_are_refused_with_nothing_changed(api, store) -> None:
    await admit(store, "m7")
    for body in ({}, {"to": ""}, {"to": "x" * 201}, {"to": 2}, {"to": "2", "force": "yes"},
                 {"to": "2", "force": 1}, {"to": "2", "extra": 1}, ["2"], None):
        r = await api.post("/v1/executions/m7/version", content=json.dumps(body),
                           headers={"content-type": "application/json"})
        assert_error(r, 422, "INVALID_REQUEST")
    assert_error(await api.post("/v1/executions/m7/version", content=b'{"to": "\\u0000"}',
                                headers={"content-type": "application/json"}), 422)
    assert await version_of(store, "m7") == "1"
    assert await events_of(store, "m7", "version_moved") == []


async def test_moving_back_resumes_an_execution_parked_for_nondeterminism(
        api_for, store, workers, suspended) -> None:
    """A forced move to code that does not fit parks the execution at its
    next delivery; moving it back (checked) makes it due, and it completes."""
    await suspended("m8")
    async with api_for(flows.V1) as api:
        r = await api.post("/v1/executions/m8/version", json={"to": "3", "force": True})
        assert r.status_code == 200, r.text
        await workers.start(workflows=flows.V3)
        assert (await api.post("/v1/executions/m8/signals/go", json=None)).status_code == 202
        parked = await wait_status(store, "m8", "parked")
        assert parked["parked_reason"] == "nondeterminism"
        assert parked["parked_detail"]["recorded"] == "reserve"
        assert parked["parked_detail"]["asked"] == "check"
        assert ("m8", "check") not in flows.CALLS  # nothing new ran

        r = await api.post("/v1/executions/m8/version", json={"to": "1"})
        assert r.status_code == 200, r.text
        assert r.json()["resumed"] is True and r.json()["check"] == "passed"
        assert r.json()["status"] == "suspended"
        record = await store.history.get("m8")
        assert record["parked_reason"] is None and record["parked_detail"] is None
        assert record["due_at"] is not None
        [_, back] = await events_of(store, "m8", "version_moved")
        assert back["detail"]["resumed"] is True and back["detail"]["from"] == "3"
        await workers.start(workflows=flows.V1)
        done = await wait_status(store, "m8", "completed")
        assert done["outcome"] == {"result": "done-v1"}


async def test_a_same_version_move_unparks_once_fixed_code_is_deployed(
        api_for, store, workers, suspended) -> None:
    """A bad deploy under the same version parks; the fixed code deployed,
    a move to the version it already has re-checks and resumes it."""
    await suspended("m9")
    bad = await workers.start(workflows=flows.deploy("1", flows.order_v3))
    await store.signals.send_signal("m9", "go", None)
    await wait_status(store, "m9", "parked")
    await workers.stop(bad)
    async with api_for(flows.deploy("1", flows.order_v3)) as api:
        assert_error(await api.post("/v1/executions/m9/version", json={"to": "1"}),
                     409, "REPLAY_DIVERGES")
    async with api_for(flows.V1) as api:
        r = await api.post("/v1/executions/m9/version", json={"to": "1"})
    assert r.status_code == 200, r.text
    assert r.json()["from"] == "1" and r.json()["resumed"] is True
    await workers.start(workflows=flows.V1)
    assert (await wait_status(store, "m9", "completed"))["outcome"] == {"result": "done-v1"}


async def test_resume_takes_a_nondeterminism_park_without_a_check(
        api, store, workers, suspended) -> None:
    await suspended("m10")
    bad = await workers.start(workflows=flows.deploy("1", flows.order_v3))
    await store.signals.send_signal("m10", "go", None)
    await wait_status(store, "m10", "parked")
    await workers.stop(bad)
    r = await api.post("/v1/executions/m10/resume", json={"by": "ops"})
    assert r.status_code == 200 and r.json() == {"status": "suspended"}, r.text
    [resumed] = await events_of(store, "m10", "resumed")
    assert resumed["detail"] == {"by": "ops", "unacknowledgedDeliveries": 0,
                                 "reason": "nondeterminism"}
    record = await store.history.get("m10")
    assert record["parked_detail"] is None and record["parked_reason"] is None
    await workers.start(workflows=flows.V1)
    assert (await wait_status(store, "m10", "completed"))["outcome"] == {"result": "done-v1"}


async def test_an_unversioned_execution_moves_to_a_version(api, store, workers) -> None:
    await admit(store, "m11", None)
    await workers.start(workflows=flows.V1)
    await wait_record(store, "m11", waiting_for_go, what="m11 waits for go")
    await workers.stop_all()
    r = await api.post("/v1/executions/m11/version", json={"to": "2"})
    assert r.status_code == 200, r.text
    assert r.json()["from"] is None and r.json()["to"] == "2"
