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

from app.api.auth import Waker
from app.api.common import (
    ERRORS,
    FORBIDDEN,
    UNAUTHENTICATED,
    _check_path_id,
    _optional_json,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.models import ID_PATTERN, SignalAnswer
from app.api.quotas import SignalQuota
from app.commands import executions as commands

router = APIRouter(prefix="/v1/executions", tags=["executions"], responses=UNAUTHENTICATED)


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
        403: refusal("FORBIDDEN: the token's role may not signal, or the workflow "
                     "restricts this signal to another role"),
        404: refusal("EXECUTION_NOT_FOUND"),
        409: refusal("EXECUTION_TERMINAL"),
        429: refusal("TOO_MANY_PENDING_SIGNALS / RATE_LIMITED: too many signals wait "
                     "unconsumed, or the token's quota is used up; retry after "
                     "Retry-After seconds"),
    },
)
async def send_signal(execution_id: str, name: Annotated[str, Path(pattern=ID_PATTERN)],
                      request: Request, store: StoreDep, settings: SettingsDep,
                      principal: Waker, _quota: SignalQuota):
    _check_path_id(execution_id)
    # The body first: nothing is looked up until the whole request is here.
    payload = await _optional_json(request, settings)
    await commands.signal(store, execution_id, name, payload, principal,
                          workflows=request.app.state.workflows or {},
                          max_pending=settings.max_pending_signals)
    return {"status": "received"}
