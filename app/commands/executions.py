"""Operator decisions on one execution: cancel (with cleanup), terminate
(without), wake, resume a parked one (poison, nondeterminism), resolve an
outcome-unknown step, send a signal. Each validates, asks the store once, and answers the
store's outcome or raises CommandError; the decisions that change an
execution's course are logged with who made them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.commands.errors import (
    API,
    CommandError,
    Wording,
    check_execution_id,
    execution_not_found,
    sentence,
)
from app.logs import operator_action
from app.store import InvalidEvent
from app.store.signals import SignalSender

RESOLUTIONS = ("retry", "succeed", "fail")
NO_RESULT: Any = object()  # resolve: no result given (null is a result)

# Pending signals drain only as the workflow consumes them: a client that hit
# the bound should come back later, not at once.
PENDING_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class Done:
    """What the store did (`cancelled` / `requested`, `resumed`, ...) and the
    execution's status after it."""

    answer: str
    status: str | None


def terminal(execution_id: str, status: str | None, what: str) -> CommandError:
    return CommandError(409, "EXECUTION_TERMINAL",
                        f"execution {execution_id!r} already ended ({status}); nothing to {what}",
                        status=status)


async def cancel(store, execution_id: str, by: str, wording: Wording = API) -> Done:
    """Persist the request; the cleanup code runs at the next step or wait."""
    return await _end(store, execution_id, by, wording, terminate=False)


async def terminate(store, execution_id: str, by: str, wording: Wording = API) -> Done:
    """Cancel at once; no code runs, the holder's later writes are refused."""
    return await _end(store, execution_id, by, wording, terminate=True)


async def _end(store, execution_id: str, by: str, wording: Wording, *, terminate: bool) -> Done:
    check_execution_id(execution_id, wording)
    what = "terminate" if terminate else "cancel"
    if terminate:
        answer, status = await store.operator.terminate(execution_id, by)
    else:
        answer, status = await store.operator.request_cancel(execution_id, by)
    operator_action(what, by=by, result=answer, execution_id=execution_id)
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "terminal":
        raise terminal(execution_id, status, what)
    return Done(answer, status)


def check_wake_time(at: datetime | None) -> None:
    if at is None:
        return
    if at.tzinfo is None:
        raise CommandError(422, "INVALID_REQUEST",
                           "at: give a time zone offset (for example 2026-01-01T00:00:00Z)")
    try:
        at.astimezone(UTC)
    except OverflowError:
        raise CommandError(422, "INVALID_REQUEST",
                           "at: out of range in UTC; give a time between years 0001 and 9999"
                           ) from None


async def wake(store, execution_id: str, at: datetime | None = None, *,
               owner: str | None = None, wording: Wording = API) -> str:
    """A delivery at `at` (default now): `requested`, or `ignored` when the
    execution has ended. `owner`: only an execution that token admitted."""
    check_execution_id(execution_id, wording)
    check_wake_time(at)
    answer = await store.operator.request_wake(execution_id, at, owner=owner)
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    return answer


async def resume(store, execution_id: str, by: str, wording: Wording = API) -> Done:
    """Make an execution parked as poison (its counter is kept) or for
    nondeterminism due again."""
    check_execution_id(execution_id, wording)
    answer, status = await store.operator.resume(execution_id, by)
    operator_action("resume", by=by, result=answer, execution_id=execution_id)
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "not_parked":
        raise CommandError(409, "EXECUTION_NOT_PARKED", sentence(
            f"execution {execution_id!r} is {status}, not parked as poison or for "
            "nondeterminism",
            wording.resolve_instead), status=status)
    return Done(answer, status)


def check_resolution(action: str, result: Any = NO_RESULT,
                     error: Mapping[str, str] | None = None) -> None:
    """retry alone; succeed with a result (null included); fail with an error."""
    def refuse(message: str) -> CommandError:
        return CommandError(422, "INVALID_RESOLUTION", message)

    if action not in RESOLUTIONS:
        raise refuse(f"action: one of {', '.join(RESOLUTIONS)}")
    if action == "succeed" and result is NO_RESULT:
        raise refuse('action succeed needs "result": the value the step returned (send '
                     '"result": null to record null); it is recorded as the step\'s result')
    if action == "fail" and error is None:
        raise refuse("action fail needs error: {name, message}")
    if action != "fail" and error is not None:
        raise refuse("error goes only with action fail")
    if action != "succeed" and result is not NO_RESULT:
        raise refuse("result goes only with action succeed")


def not_outcome_unknown(execution_id: str, step_key: str, status: str | None,
                        wording: Wording = API) -> CommandError:
    return CommandError(409, "STEP_NOT_OUTCOME_UNKNOWN", sentence(
        f"step {step_key!r} of {execution_id!r} is not waiting for a decision (the execution "
        f"is {status})", wording.see_steps), status=status)


async def resolve(store, execution_id: str, step_key: str, action: str, by: str, *,
                  result: Any = NO_RESULT, error: Mapping[str, str] | None = None,
                  wording: Wording = API) -> Done:
    """Settle an outcome-unknown step: retry it, or record its result or
    error; the execution becomes due."""
    check_execution_id(execution_id, wording)
    check_execution_id(step_key, wording)
    check_resolution(action, result, error)
    try:
        answer, status = await store.operator.resolve_step(
            execution_id, step_key, action, by=by,
            result=None if result is NO_RESULT else result,
            error=dict(error) if error is not None else None)
    except InvalidEvent as exc:
        raise CommandError(422, "INVALID_RESOLUTION", sentence(
            f"{wording.the_result} cannot be stored exactly ({exc})", wording.plain_json)
        ) from None
    operator_action(f"resolve {action}", by=by, result=answer,
                    execution_id=execution_id, step_key=step_key)
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "step_not_found":
        raise CommandError(404, "STEP_NOT_FOUND", sentence(
            f"execution {execution_id!r} has no step {step_key!r}", wording.step_keys),
            status=status)
    if answer == "not_outcome_unknown":
        raise not_outcome_unknown(execution_id, step_key, status, wording)
    return Done(answer, status)


def sender_of(principal) -> SignalSender:
    """The sender recorded for `principal`: its token and the role it signals
    with (operate tokens: "operate"; trigger tokens: "trigger")."""
    role = "operate" if principal.may("operate") else "trigger"
    return SignalSender(principal.token_id, principal.name, role)


def denied_workflows(workflows: Mapping[str, Any], name: str, principal) -> list[str]:
    """The registered workflows that do not let `principal` send signal `name`
    (`@workflow(signals={name: role})`). The store's statement refuses
    executions of these, so the check and the write read the same row."""
    return sorted(wid for wid, d in workflows.items() if not d.may_signal(name, principal.roles))


async def signal(store, execution_id: str, name: str, payload: Any, principal, *,
                 workflows: Mapping[str, Any], max_pending: int,
                 wording: Wording = API) -> None:
    """Store the signal with its sender and request a wake, or nothing."""
    check_execution_id(execution_id, wording)
    try:
        answer, detail = await store.signals.send_signal(
            execution_id, name, payload,
            sender=sender_of(principal),
            owner=principal.token_id if principal.owns_only() else None,
            denied_workflows=denied_workflows(workflows, name, principal),
            max_pending=max_pending,
        )
    except InvalidEvent as exc:
        raise CommandError(422, "INVALID_EXECUTION_EVENT", sentence(
            f"the payload cannot be stored exactly ({exc})", wording.plain_json)) from None
    if answer == "not_found":
        raise execution_not_found(execution_id, wording)
    if answer == "terminal":
        raise CommandError(
            409, "EXECUTION_TERMINAL",
            f"execution {execution_id!r} is {detail}; a finished execution takes no signals",
            status=detail)
    if answer == "forbidden":
        roles: Sequence[str] = sorted(workflows[detail].signal_roles[name])
        either = " or ".join(roles)
        raise CommandError(
            403, "FORBIDDEN",
            f"workflow {detail!r} accepts signal {name!r} only from a token with role {either}; "
            f"token {principal.name!r} has {', '.join(sorted(principal.roles))}: ask someone "
            f"holding {either} to send it",
            requiredRoles=list(roles))
    if answer == "too_many":
        raise CommandError(
            429, "TOO_MANY_PENDING_SIGNALS",
            f"execution {execution_id!r} already holds {detail} unconsumed signals, the most "
            f"FENCEPOST_MAX_PENDING_SIGNALS ({max_pending}) allows; nothing was stored: send "
            "again once its workflow has consumed some",
            headers={"Retry-After": str(PENDING_RETRY_AFTER_SECONDS)},
            pending=int(detail))
