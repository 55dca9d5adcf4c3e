"""app/commands/versions.py and the store's move, below the API: the
refusals each caller gets (stable code, nothing changed), parks other than
nondeterminism stay parked, and resume takes a nondeterminism park but not
an outcome-unknown one."""

from __future__ import annotations

import pytest

from app.commands.errors import CommandError
from app.commands.versions import move_version, move_versions
from tests.support.history import events_of
from tests.versions import flows
from tests.versions.conftest import admit


async def refused(call) -> CommandError:
    with pytest.raises(CommandError) as caught:
        await call
    return caught.value


async def park(store, eid: str, reason: str, step: str | None = None) -> None:
    await store.pool.execute(
        "UPDATE executions SET status = 'parked', parked_reason = $2, parked_step = $3, "
        "parked_detail = CASE WHEN $2 = 'nondeterminism' THEN '{\"position\": 0}'::jsonb END "
        "WHERE execution_id = $1", eid, reason, step)


async def test_refusals_have_stable_codes_and_change_nothing(store) -> None:
    await admit(store, "q1")
    error = await refused(move_version(store, "q1", "2", by="t", workflows=None))
    assert (error.http_status, error.code) == (409, "REPLAY_CHECK_UNAVAILABLE")
    assert error.extra == {"carried": None}

    async def broken(definition, history, workflows):
        raise RuntimeError("the document is odd")

    error = await refused(move_version(store, "q1", "2", by="t", workflows=flows.V2,
                                       check=broken))
    assert (error.http_status, error.code) == (409, "REPLAY_CHECK_FAILED")
    assert "RuntimeError: the document is odd" in error.message
    for to in (3, "", "v" * 201, "a\x00b"):
        error = await refused(move_version(store, "q1", to, by="t", force=True))
        assert (error.http_status, error.code) == (422, "INVALID_REQUEST"), to
    error = await refused(move_version(store, "q\x00", "2", by="t", force=True))
    assert (error.http_status, error.code) == (404, "EXECUTION_NOT_FOUND")
    assert (await store.history.get("q1"))["code_version"] == "1"
    assert await events_of(store, "q1", "version_moved") == []


@pytest.mark.parametrize("kwargs", [
    {"workflow_id": None}, {"workflow_id": "a b"}, {"statuses": ["completed"]},
    {"statuses": []}, {"ids": []}, {"limit": 0}, {"limit": 1001}, {"limit": True},
    {"from_version": ""},
])
async def test_bulk_input_is_checked_before_anything_is_read(store, kwargs) -> None:
    await admit(store, "q2")
    call = {"workflow_id": "vm-order", **kwargs}
    error = await refused(move_versions(store, "2", by="t", force=True, **call))
    assert (error.http_status, error.code) == (422, "INVALID_REQUEST"), kwargs
    assert "send it again" in error.message or "fix it" in error.message
    assert (await store.history.get("q2"))["code_version"] == "1"


async def test_other_parks_stay_parked_when_moved(store) -> None:
    await admit(store, "q3")
    await park(store, "q3", "outcome_unknown", "charge")
    done = await move_version(store, "q3", "2", by="t", force=True)
    assert done.moved.status == "parked" and done.moved.resumed is False
    record = await store.history.get("q3")
    assert record["parked_reason"] == "outcome_unknown" and record["parked_step"] == "charge"
    await admit(store, "q4")
    await park(store, "q4", "poison")
    done = await move_version(store, "q4", "2", by="t", force=True)
    assert done.moved.status == "parked"


async def test_resume_takes_nondeterminism_and_poison_not_outcome_unknown(store) -> None:
    await admit(store, "q5")
    await park(store, "q5", "nondeterminism", "reserve")
    assert await store.operator.resume("q5", "ops") == ("resumed", "admitted")
    [event] = await events_of(store, "q5", "resumed")
    assert event["detail"] == {"by": "ops", "unacknowledgedDeliveries": 0,
                               "reason": "nondeterminism"}
    await admit(store, "q6")
    await park(store, "q6", "poison")
    assert await store.operator.resume("q6", "ops") == ("resumed", "admitted")
    [event] = await events_of(store, "q6", "resumed")
    assert event["detail"] == {"by": "ops", "unacknowledgedDeliveries": 0}
    await admit(store, "q7")
    await park(store, "q7", "outcome_unknown", "charge")
    assert await store.operator.resume("q7", "ops") == ("not_parked", "parked")


async def test_a_move_is_refused_when_an_operator_changed_the_execution_since_the_check(
        store) -> None:
    """Changes without a claim are seen too: an end and a redrive between
    the check and the move leave token and status as they were, but not the
    redrive count; a resume leaves the token but not the status."""
    await admit(store, "q8")
    seen = await store.versions.target("q8")
    await store.operator.terminate("q8", "ops")
    answer, _ = await store.redrives.redrive("q8", "ops")
    assert answer == "redriven"
    after = await store.versions.target("q8")
    assert (after.token, after.status) == (seen.token, seen.status)
    assert await store.versions.move("q8", "2", by="t", check="passed", seen=seen) == (
        "changed", None)
    await admit(store, "q9")
    await park(store, "q9", "poison")
    seen = await store.versions.target("q9")
    await store.operator.resume("q9", "ops")
    assert await store.versions.move("q9", "2", by="t", check="passed", seen=seen) == (
        "changed", None)
    assert (await store.history.get("q8"))["code_version"] == "1"
    assert (await store.history.get("q9"))["code_version"] == "1"
