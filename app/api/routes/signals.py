"""Signals: stored with their sender, in one statement path that also
carries the owner predicate and the workflow's sender restriction.

The body is read (and bounded) before any work is done on the request; then
one transaction locks the target row with every predicate in that same
statement (not terminal; for a trigger token, admitted by it; for a workflow
that restricts who may send this signal, a sender holding the role) and,
under that lock, stores the signal, its `signal_received` event and the wake,
unless the execution already holds FENCEPOST_MAX_PENDING_SIGNALS unconsumed
signals. A refused request stores nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from app.api.auth import Principal, Waker
from app.api.common import ERRORS, FORBIDDEN, UNAUTHENTICATED, _check_path_id, _json
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError, not_found
from app.api.models import ID_PATTERN, ErrorBody, SignalAnswer
from app.api.quotas import SignalQuota
from app.store import InvalidEvent
from app.store.signals import SignalSender

router = APIRouter(prefix="/v1/executions", tags=["executions"], responses=UNAUTHENTICATED)

# Pending signals drain only as the workflow consumes them: a client that hit
# the bound should come back later, not at once.
PENDING_RETRY_AFTER_SECONDS = 5


def sender_of(principal: Principal) -> SignalSender:
    """The sender recorded for `principal`: its token and the role it signals
    with (operate tokens: "operate"; trigger tokens: "trigger")."""
    role = "operate" if principal.may("operate") else "trigger"
    return SignalSender(principal.token_id, principal.name, role)


def denied_workflows(request: Request, name: str, principal: Principal) -> list[str]:
    """The registered workflows that do not let `principal` send signal `name`
    (`@workflow(signals={name: role})`). The statement refuses executions of
    these, so the check and the write read the same row."""
    definitions = request.app.state.workflows or {}
    return sorted(wid for wid, d in definitions.items() if not d.may_signal(name, principal.roles))


@router.post(
    "/{execution_id}/signals/{name}",
    status_code=202,
    response_model=SignalAnswer,
    summary="Deliver a signal: stored with its sender, a wake requested, consumed once by the "
            "workflow",
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": {"description": "Any JSON value: the payload."}}},
        }
    },
    responses={
        **FORBIDDEN,
        **ERRORS,
        403: {"model": ErrorBody,
              "description": "FORBIDDEN: the token's role may not signal, or the workflow "
                             "restricts this signal to another role"},
        404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND"},
        409: {"model": ErrorBody, "description": "EXECUTION_TERMINAL"},
        429: {"model": ErrorBody,
              "description": "TOO_MANY_PENDING_SIGNALS / RATE_LIMITED: too many signals wait "
                             "unconsumed, or the token's quota is used up; retry after "
                             "Retry-After seconds"},
    },
)
async def send_signal(execution_id: str, name: Annotated[str, Path(pattern=ID_PATTERN)],
                      request: Request, store: StoreDep, settings: SettingsDep,
                      principal: Waker, _quota: SignalQuota):
    _check_path_id(execution_id)
    # The body first: nothing is looked up until the whole request is here.
    payload = None
    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        payload = await _json(request, settings)
    try:
        answer, detail = await store.send_signal(
            execution_id, name, payload,
            sender=sender_of(principal),
            owner=principal.token_id if principal.owns_only() else None,
            denied_workflows=denied_workflows(request, name, principal),
            max_pending=settings.max_pending_signals,
        )
    except InvalidEvent as exc:
        raise ApiError(422, "INVALID_EXECUTION_EVENT",
                       f"the payload cannot be stored exactly ({exc}); send plain JSON") from None
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "terminal":
        raise ApiError(
            409, "EXECUTION_TERMINAL",
            f"execution {execution_id!r} is {detail}; a finished execution takes no signals",
            status=detail,
        )
    if answer == "forbidden":
        definition = (request.app.state.workflows or {})[detail]
        roles = " or ".join(sorted(definition.signal_roles[name]))
        raise ApiError(
            403, "FORBIDDEN",
            f"workflow {detail!r} accepts signal {name!r} only from a token with role {roles}; "
            f"token {principal.name!r} has {', '.join(sorted(principal.roles))}: ask someone "
            f"holding {roles} to send it",
            requiredRoles=sorted(definition.signal_roles[name]),
        )
    if answer == "too_many":
        raise ApiError(
            429, "TOO_MANY_PENDING_SIGNALS",
            f"execution {execution_id!r} already holds {detail} unconsumed signals, the most "
            f"FENCEPOST_MAX_PENDING_SIGNALS ({settings.max_pending_signals}) allows; nothing was "
            "stored: send again once its workflow has consumed some",
            headers={"Retry-After": str(PENDING_RETRY_AFTER_SECONDS)},
            pending=int(detail),
        )
    return {"status": "received"}
