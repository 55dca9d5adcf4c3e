"""The commands on one execution, called directly against Postgres: each
refusal is one CommandError with its HTTP status and stable code, and
nothing is written by a refused command."""

from __future__ import annotations

from datetime import datetime

import pytest

from app.api.auth import ANONYMOUS, Principal
from app.commands import DASHBOARD, CommandError
from app.commands import executions as commands
from app.store import ExecutionStore
from tests.commands.conftest import WORKFLOWS
from tests.support.admission import admit
from tests.support.waiting import wait_status

# Reads, and triggers: not operate, so not the sender an operate-only signal needs.
TRIGGER = Principal(None, "bob", frozenset({"read", "trigger"}))


async def refused(awaitable, status: int, code: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        await awaitable
    assert (caught.value.http_status, caught.value.code) == (status, code), caught.value.message
    return caught.value


async def ended(store: ExecutionStore, execution_id: str) -> str:
    await admit(store, "cmd-wait", execution_id)
    await store.operator.terminate(execution_id, "setup")
    return execution_id


async def waiting(store: ExecutionStore, workers, execution_id: str) -> str:
    """An execution with step "prep" recorded, waiting for a signal."""
    await admit(store, "cmd-wait", execution_id)
    await workers.start()
    await wait_status(store, execution_id, "suspended")
    return execution_id


# ------------------------------------------------------------ cancel, terminate


@pytest.mark.parametrize("command", [commands.cancel, commands.terminate])
async def test_ending_a_missing_execution_is_not_found(store, command) -> None:
    e = await refused(command(store, "nobody", "alice"), 404, "EXECUTION_NOT_FOUND")
    assert e.message == ("no execution with ID 'nobody'; check the ID, or admit it with "
                         "POST /v1/executions")
    e = await refused(command(store, "nobody", "alice", DASHBOARD), 404, "EXECUTION_NOT_FOUND")
    assert e.message == "no execution with ID 'nobody'; check the ID"
    await refused(command(store, "bad\x00id", "alice"), 404, "EXECUTION_NOT_FOUND")


@pytest.mark.parametrize("command, what", [(commands.cancel, "cancel"),
                                           (commands.terminate, "terminate")])
async def test_ending_an_ended_execution_is_terminal(store, command, what) -> None:
    await ended(store, "e1")
    e = await refused(command(store, "e1", "alice"), 409, "EXECUTION_TERMINAL")
    assert e.message == f"execution 'e1' already ended (cancelled); nothing to {what}"
    assert e.extra == {"status": "cancelled"}


async def test_cancel_and_terminate_answer_what_the_store_did(store) -> None:
    await admit(store, "cmd-wait", "never-ran")
    assert await commands.cancel(store, "never-ran", "alice") == commands.Done(
        "cancelled", "cancelled")


# ------------------------------------------------------------------------ wake


async def test_waking_a_missing_execution_is_not_found(store) -> None:
    await refused(commands.wake(store, "nobody"), 404, "EXECUTION_NOT_FOUND")


async def test_a_wake_time_without_an_offset_is_an_invalid_request(store) -> None:
    await admit(store, "cmd-wait", "w1")
    e = await refused(commands.wake(store, "w1", datetime(2030, 1, 1)), 422, "INVALID_REQUEST")
    assert e.message.startswith("at: give a time zone offset")


async def test_a_wake_of_an_ended_execution_is_ignored(store) -> None:
    await ended(store, "w2")
    assert await commands.wake(store, "w2") == "ignored"


# ---------------------------------------------------------------------- resume


async def test_resuming_a_missing_execution_is_not_found(store) -> None:
    await refused(commands.resume(store, "nobody", "alice"), 404, "EXECUTION_NOT_FOUND")


async def test_resuming_what_is_not_parked_is_refused_with_the_surfaces_hint(store) -> None:
    await admit(store, "cmd-wait", "r1")
    e = await refused(commands.resume(store, "r1", "alice"), 409, "EXECUTION_NOT_PARKED")
    assert e.message == ("execution 'r1' is admitted, not parked as poison or for "
                         "nondeterminism; an outcome-unknown step is settled with "
                         "POST .../steps/{key}/resolve")
    e = await refused(commands.resume(store, "r1", "alice", DASHBOARD), 409,
                      "EXECUTION_NOT_PARKED")
    assert e.message.endswith("an outcome-unknown step is settled by resolving it")


# --------------------------------------------------------------------- resolve


@pytest.mark.parametrize("action, result, error, says", [
    ("maybe", commands.NO_RESULT, None, "action: one of retry, succeed, fail"),
    ("succeed", commands.NO_RESULT, None, 'action succeed needs "result"'),
    ("fail", commands.NO_RESULT, None, "action fail needs error"),
    ("retry", commands.NO_RESULT, {"name": "E", "message": ""}, "error goes only with"),
    ("retry", None, None, "result goes only with action succeed"),
])
async def test_an_inconsistent_resolution_is_refused_before_the_store(
        store, action, result, error, says) -> None:
    e = await refused(commands.resolve(store, "nobody", "prep", action, "alice", result=result,
                                       error=error), 422, "INVALID_RESOLUTION")
    assert e.message.startswith(says), e.message


async def test_resolving_in_a_missing_execution_is_not_found(store) -> None:
    await refused(commands.resolve(store, "nobody", "prep", "retry", "alice"),
                  404, "EXECUTION_NOT_FOUND")


async def test_resolving_a_missing_step_is_step_not_found(store, workers) -> None:
    await waiting(store, workers, "s1")
    e = await refused(commands.resolve(store, "s1", "nope", "retry", "alice"),
                      404, "STEP_NOT_FOUND")
    assert e.message.startswith("execution 's1' has no step 'nope'; the keys it has are listed")


async def test_resolving_a_recorded_step_is_not_outcome_unknown(store, workers) -> None:
    await waiting(store, workers, "s2")
    e = await refused(commands.resolve(store, "s2", "prep", "retry", "alice", wording=DASHBOARD),
                      409, "STEP_NOT_OUTCOME_UNKNOWN")
    assert e.message == ("step 'prep' of 's2' is not waiting for a decision (the execution "
                         "is suspended)")


async def test_a_result_postgres_cannot_hold_is_an_invalid_resolution(store, workers) -> None:
    await waiting(store, workers, "s3")
    e = await refused(commands.resolve(store, "s3", "prep", "succeed", "alice",
                                       result={"text": "nul \x00"}), 422, "INVALID_RESOLUTION")
    assert "cannot be stored exactly" in e.message


# ---------------------------------------------------------------------- signal


def _signal(store, execution_id: str, name: str = "go", payload=None, principal=ANONYMOUS,
            max_pending: int = 10):
    return commands.signal(store, execution_id, name, payload, principal,
                           workflows=WORKFLOWS, max_pending=max_pending)


async def test_signalling_a_missing_execution_is_not_found(store) -> None:
    await refused(_signal(store, "nobody"), 404, "EXECUTION_NOT_FOUND")


async def test_signalling_an_ended_execution_is_terminal(store) -> None:
    await ended(store, "g1")
    e = await refused(_signal(store, "g1"), 409, "EXECUTION_TERMINAL")
    assert e.extra == {"status": "cancelled"}


async def test_a_signal_restricted_to_operate_is_forbidden_to_a_trigger(store) -> None:
    await admit(store, "cmd-wait", "g2")
    e = await refused(_signal(store, "g2", "approve", principal=TRIGGER), 403, "FORBIDDEN")
    assert e.extra == {"requiredRoles": ["operate"]}


async def test_past_the_pending_bound_a_signal_is_too_many(store) -> None:
    await admit(store, "cmd-wait", "g3")
    await _signal(store, "g3", max_pending=1)
    e = await refused(_signal(store, "g3", max_pending=1), 429, "TOO_MANY_PENDING_SIGNALS")
    assert e.headers == {"Retry-After": str(commands.PENDING_RETRY_AFTER_SECONDS)}
    assert e.extra == {"pending": 1}


async def test_a_payload_postgres_cannot_hold_is_an_invalid_event(store) -> None:
    await admit(store, "cmd-wait", "g4")
    await refused(_signal(store, "g4", payload="nul \x00"), 422, "INVALID_EXECUTION_EVENT")
