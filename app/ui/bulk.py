"""Bulk operations from the dashboard: a form for an action and its filter,
a dry run (how many, a sample), the started operation's progress page, and
its Stop button. Started and stopped through the operator commands."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.blocked import workflows_of
from app.commands import DASHBOARD
from app.commands.operations import (
    OPERATION_ID,
    operation_not_found,
    start_operation,
    stop_operation,
)
from app.store.bulk import ACTIONS as BULK_ACTIONS
from app.ui.forms import BulkForm, bulk_form
from app.ui.pages import live
from app.ui.render import UIRoute, pathseg, render
from app.ui.session import Session, checked_post, viewer

router = APIRouter(route_class=UIRoute)

ACTION_WORDS = {
    "cancel": "cancel each one (as the Cancel button does)",
    "redrive": "redrive each one in place (failed, timed out or cancelled ones)",
    "resume": "resume each one parked as poison or for nondeterminism",
    "resolve": "resolve each one's parked step with retry: call it again with the same "
               "idempotency key",
}
assert set(ACTION_WORDS) == set(BULK_ACTIONS)

# Where an unknown operation's refusal sends the viewer.
START_ONE = "start one at /ui/operations"


async def _bulk_page(request: Request, session: Session, b: BulkForm, *,
                     counted: tuple[int, list[str]] | None = None, status: int = 200) -> Response:
    store = request.app.state.store
    live_ids = await live(request)
    return render(request, "operations.html", {
        "b": b, "counted": counted, "actions": ACTION_WORDS,
        "workflow_ids": sorted(set(await store.dashboard.workflow_ids_seen()) | workflows_of(live_ids)
                               | set(request.app.state.workflows or {})),
        "limit": request.app.state.settings.max_operation_executions,
    }, session=session, status=status)


@router.get("/operations")
async def operations_page(request: Request) -> Response:
    session = await viewer(request, need="operate")
    return await _bulk_page(request, session, BulkForm())


@router.post("/operations")
async def operations_post(request: Request) -> Response:
    """do=count: the dry run (how many, a sample), nothing acted on; do=start:
    create the operation (the items are what the filter matches now)."""
    session, form = await checked_post(request)
    b = bulk_form(form)
    if b.problems:
        return await _bulk_page(request, session, b, status=422)
    store = request.app.state.store
    if form.get("do") != "start":
        return await _bulk_page(request, session, b,
                                counted=await store.operations.preview_operation(b.spec))
    record = await start_operation(
        store, b.action, b.spec, session.actor, options=b.options, reason=b.reason,
        max_matched=request.app.state.settings.max_operation_executions, wording=DASHBOARD)
    return RedirectResponse(f"/ui/operations/{record['operation_id']}", status_code=303)


async def _operation(request: Request, operation_id: str) -> dict:
    record = None
    if OPERATION_ID.fullmatch(operation_id):
        record = await request.app.state.store.operations.get_operation(operation_id)
    if record is None:
        raise operation_not_found(operation_id, START_ONE)
    return record


@router.get("/operations/{operation_id}")
async def operation_page(request: Request, operation_id: str) -> Response:
    session = await viewer(request, need="operate")
    op = await _operation(request, operation_id)
    return render(request, "operation.html", {
        "op": op, "now": await request.app.state.store.clock.db_now(), "actions": ACTION_WORDS,
        "refresh": 2 if op["status"] == "running" else None,
        "notice": "Stopped: what was done stays done; the rest is not acted on."
        if request.query_params.get("done") == "stopped" else None,
    }, session=session)


@router.post("/operations/{operation_id}/cancel")
async def operation_cancel(request: Request, operation_id: str) -> Response:
    session, _ = await checked_post(request)
    await _operation(request, operation_id)
    await stop_operation(request.app.state.store, operation_id, session.actor)
    return RedirectResponse(f"/ui/operations/{operation_id}?done=stopped", status_code=303)


@router.get("/operations/{operation_id}/cancel")
async def operation_cancel_by_get(operation_id: str) -> Response:
    """A reloaded Stop URL shows the operation."""
    return RedirectResponse(f"/ui/operations/{pathseg(operation_id)}", status_code=303)
