"""Redrive and fork, called directly against Postgres: each refusal is one
CommandError with its HTTP status and stable code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.commands import DASHBOARD
from app.commands import redrive as retry
from app.registry import SYSTEM_ID_SEPARATOR
from app.store import ExecutionStore
from tests.commands.conftest import WORKFLOWS
from tests.commands.test_executions import refused, waiting
from tests.support.admission import admit
from tests.support.waiting import wait_status

# ---------------------------------------------------------------------- redrive


async def test_redriving_a_missing_execution_is_not_found(store) -> None:
    await refused(retry.redrive(store, "nobody", "alice"), 404, "EXECUTION_NOT_FOUND")


async def test_a_deadline_and_a_timeout_together_are_an_invalid_request(store) -> None:
    e = await refused(retry.redrive(store, "x", "alice", deadline=datetime.now(UTC),
                                    timeout_seconds=5), 422, "INVALID_REQUEST")
    assert e.message == "give either deadline or timeoutSeconds, not both"


async def test_a_deadline_without_an_offset_is_an_invalid_request(store) -> None:
    await refused(retry.redrive(store, "x", "alice", deadline=datetime(2030, 1, 1)),
                  422, "INVALID_REQUEST")


async def test_a_past_deadline_is_refused(store) -> None:
    await refused(retry.redrive(store, "x", "alice",
                                deadline=datetime.now(UTC) - timedelta(hours=1)),
                  422, "DEADLINE_IN_THE_PAST")


async def test_redriving_what_has_not_ended_is_refused(store) -> None:
    await admit(store, "cmd-wait", "n1")
    e = await refused(retry.redrive(store, "n1", "alice"), 409, "EXECUTION_NOT_ENDED")
    assert e.extra == {"status": "admitted"}


async def test_a_completed_execution_needs_a_step_to_redrive_from(store, workers) -> None:
    await admit(store, "cmd-done", "c1")
    await workers.start()
    await wait_status(store, "c1", "completed")
    e = await refused(retry.redrive(store, "c1", "alice"), 409, "REDRIVE_NEEDS_FROM_STEP")
    assert e.message == "execution 'c1' completed; give fromStep to run it again from that step on"
    e = await refused(retry.redrive(store, "c1", "alice", wording=DASHBOARD), 409,
                      "REDRIVE_NEEDS_FROM_STEP")
    assert e.message.startswith("execution 'c1' completed; choose the step")
    e = await refused(retry.redrive(store, "c1", "alice", from_step="nope"),
                      422, "STEP_NOT_FOUND")
    assert e.message.startswith("execution 'c1' has no recorded step 'nope'")


# ------------------------------------------------------------------------- fork


def _fork(store: ExecutionStore, source: str, **kw):
    kw.setdefault("from_step", "prep")
    return retry.fork(store, source, "alice", workflows=WORKFLOWS, **kw)


async def test_forking_a_missing_execution_is_not_found(store) -> None:
    await refused(_fork(store, "nobody"), 404, "EXECUTION_NOT_FOUND")


async def test_forking_from_a_missing_step_is_step_not_found(store, workers) -> None:
    await waiting(store, workers, "f1")
    await refused(_fork(store, "f1", from_step="nope"), 422, "STEP_NOT_FOUND")


async def test_forking_under_a_taken_id_is_a_conflict(store, workers) -> None:
    await waiting(store, workers, "f2")
    e = await refused(_fork(store, "f2", new_id="f2"), 409, "EXECUTION_ID_CONFLICT")
    assert e.extra["executionId"] == "f2"


async def test_fork_params_the_workflow_refuses_are_invalid_params(store) -> None:
    await admit(store, "cmd-typed", "t1", params={"amount": 1})
    e = await refused(_fork(store, "t1", params={"amount": "many"}), 422, "INVALID_PARAMS")
    assert e.message.startswith("params.amount:")


async def test_fork_params_postgres_cannot_hold_are_an_invalid_event(store, workers) -> None:
    await waiting(store, workers, "f3")
    await refused(_fork(store, "f3", params={"text": "nul \x00"}), 422,
                  "INVALID_EXECUTION_EVENT")


async def test_a_fork_without_an_id_gets_a_derived_one(store, workers) -> None:
    await waiting(store, workers, "f4")
    forked = await _fork(store, "f4")
    assert forked.execution_id.startswith(f"f4{SYSTEM_ID_SEPARATOR}fork-")


@pytest.mark.parametrize("length", [10, 995])
def test_a_derived_fork_id_fits_an_execution_id(length) -> None:
    assert len(retry.fork_id("a" * length)) <= retry.MAX_EXECUTION_ID
