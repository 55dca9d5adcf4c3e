"""Trying again after a failure: redrive an ended execution in place (same
ID, same idempotency keys, completed steps not run again), or fork a new
execution that copies the steps recorded before a chosen one."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from app.commands.errors import (
    API,
    CommandError,
    Wording,
    check_execution_id,
    execution_not_found,
    invalid,
    sentence,
)
from app.registry import SYSTEM_ID_SEPARATOR
from app.store import InvalidEvent

# The longest execution ID (EXECUTION_ID_PATTERN's length).
MAX_EXECUTION_ID = 1000


def fork_id(source: str) -> str:
    """The default ID of a fork of `source` (derived: no client can take it)."""
    candidate = f"{source}{SYSTEM_ID_SEPARATOR}fork-{secrets.token_hex(4)}"
    if len(candidate) <= MAX_EXECUTION_ID:
        return candidate
    return f"fork{SYSTEM_ID_SEPARATOR}{secrets.token_hex(16)}"


def check_params(workflows: Mapping[str, Any] | None, workflow_id: str, params: Any):
    """The workflow's definition with `params` checked against its model, or
    None when no registry is known (any workflow is accepted then).
    404 WORKFLOW_NOT_FOUND / 422 INVALID_PARAMS otherwise."""
    if workflows is None:
        return None
    definition = workflows.get(workflow_id)
    if definition is None:
        raise CommandError(
            404, "WORKFLOW_NOT_FOUND",
            f"no workflow {workflow_id!r} is registered; registered: "
            f"{', '.join(sorted(workflows)) or 'none'} (FENCEPOST_WORKFLOWS)",
        )
    try:
        definition.parse_params(params)
    except ValidationError as exc:
        raise invalid(exc, "INVALID_PARAMS", prefix="params") from None
    return definition


def step_not_found(execution_id: str, step: str | None, wording: Wording = API) -> CommandError:
    """The request's fromStep names no recorded step. 422, not 404: the
    execution the path names exists; the body is what is wrong (the code
    stays STEP_NOT_FOUND, which is what clients map)."""
    return CommandError(422, "STEP_NOT_FOUND", sentence(
        f"execution {execution_id!r} has no recorded step {step!r}", wording.recorded_steps))


def not_ended(execution_id: str, status: str | None) -> CommandError:
    return CommandError(409, "EXECUTION_NOT_ENDED",
                        f"execution {execution_id!r} is {status}; only a failed, timed_out, "
                        "cancelled or completed execution can be redriven (cancel it first, or "
                        "wait for it to end)", status=status)


async def redrive(store, execution_id: str, by: str, *, from_step: str | None = None,
                  deadline: datetime | None = None, timeout_seconds: float | None = None,
                  reason: str | None = None, owner: str | None = None,
                  wording: Wording = API):
    """Reopen an ended execution under the same ID; the store's Redriven."""
    check_execution_id(execution_id, wording)
    if deadline is not None and timeout_seconds is not None:
        raise CommandError(422, "INVALID_REQUEST",
                           "give either deadline or timeoutSeconds, not both")
    if deadline is not None:
        if deadline.tzinfo is None:
            raise CommandError(422, "INVALID_REQUEST", "deadline: give a time zone offset "
                               "(for example 2026-01-01T00:00:00Z)")
        passed, now = await store.clock.deadline_passed(deadline)
        if passed:
            raise CommandError(422, "DEADLINE_IN_THE_PAST",
                               f"deadline {deadline.isoformat()} is at or before now "
                               f"({now.isoformat()}, database clock); nothing was redriven")
    answer, detail = await store.redrives.redrive(
        execution_id, by, from_step=from_step, deadline=deadline,
        timeout_seconds=timeout_seconds, reason=reason, owner=owner)
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "step_not_found":
        raise step_not_found(execution_id, from_step, wording)
    if answer == "not_ended":
        raise not_ended(execution_id, detail)
    if answer == "completed":
        raise CommandError(409, "REDRIVE_NEEDS_FROM_STEP", sentence(
            f"execution {execution_id!r} completed", wording.needs_from_step),
            status="completed")
    return detail


async def fork(store, execution_id: str, by: str, *, from_step: str, new_id: str | None = None,
               params: Any = None, owner: str | None = None, admitted_by: str | None = None,
               workflows: Mapping[str, Any] | None = None, wording: Wording = API):
    """A new execution of the source's workflow with copies of the steps
    recorded before `from_step`; the store's Forked. `params` None: the
    source's. New params are checked against the workflow's model when its
    definition is known; a source whose workflow is not known forks as is."""
    check_execution_id(execution_id, wording)
    record = await store.history.get(execution_id, owner=owner)
    if record is None:
        raise execution_not_found(execution_id, wording)
    definition = (workflows or {}).get(record["workflow_id"])
    if definition is not None:
        check_params(workflows, record["workflow_id"],
                     params if params is not None else record["params"])
    new_id = new_id or fork_id(execution_id)
    try:
        answer, detail = await store.redrives.fork(
            execution_id, by, from_step=from_step, new_id=new_id, params=params, owner=owner,
            admitted_by=admitted_by,
            timeout_seconds=definition.timeout_seconds if definition is not None else None)
    except InvalidEvent as exc:
        raise CommandError(422, "INVALID_EXECUTION_EVENT", sentence(
            f"params cannot be stored exactly ({exc})", f"{wording.plain_json} values")) from None
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "step_not_found":
        raise step_not_found(execution_id, from_step, wording)
    if answer == "conflict":
        raise CommandError(409, "EXECUTION_ID_CONFLICT", sentence(
            f"execution ID {new_id!r} is taken ({detail.status})", wording.other_fork_id),
            executionId=new_id, status=detail.status, workflowId=detail.workflow_id)
    return detail
