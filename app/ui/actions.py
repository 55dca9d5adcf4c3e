"""The acting POSTs on one execution: cancel, terminate, wake, resume,
resolve, redrive, fork. Each is checked (same origin, role operate, the
form's CSRF field), carried out by the operator commands, and answered with
a redirect to the execution (303) or a refusal page."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.commands import DASHBOARD, CommandError
from app.commands import executions as commands
from app.commands import redrive as retry
from app.ui.forms import fork_form, redrive_form, resolution
from app.ui.pages import check_id, fork_page, record, recorded_steps, redrive_page
from app.ui.render import UIRoute, back, pathseg, render
from app.ui.session import Session, checked_post

router = APIRouter(route_class=UIRoute)


async def _acting(request: Request, execution_id: str) -> Session:
    """The operator, once the POST passed its checks and the ID can be one."""
    session, _ = await checked_post(request)
    check_id(execution_id, session)
    return session


@router.post("/executions/{execution_id}/cancel")
async def cancel(request: Request, execution_id: str) -> Response:
    session = await _acting(request, execution_id)
    done = await commands.cancel(request.app.state.store, execution_id, session.actor, DASHBOARD)
    return back(execution_id, "cancelled" if done.answer == "cancelled" else "cancel-requested")


@router.post("/executions/{execution_id}/terminate")
async def terminate(request: Request, execution_id: str) -> Response:
    session = await _acting(request, execution_id)
    await commands.terminate(request.app.state.store, execution_id, session.actor, DASHBOARD)
    return back(execution_id, "terminated")


@router.post("/executions/{execution_id}/wake")
async def wake(request: Request, execution_id: str) -> Response:
    await _acting(request, execution_id)
    answer = await commands.wake(request.app.state.store, execution_id, wording=DASHBOARD)
    return back(execution_id, "woken" if answer == "requested" else "wake-ignored")


@router.post("/executions/{execution_id}/resume")
async def resume(request: Request, execution_id: str) -> Response:
    session = await _acting(request, execution_id)
    await commands.resume(request.app.state.store, execution_id, session.actor, DASHBOARD)
    return back(execution_id, "resumed")


@router.post("/executions/{execution_id}/resolve")
async def resolve(request: Request, execution_id: str) -> Response:
    """Without confirm=yes: the review page saying what will happen. With it:
    settle the step and go back to the execution."""
    session, form = await checked_post(request)
    row, live = await record(request, execution_id, session)
    res = resolution(form, request)
    effect = None
    if not res.problems:
        effects = await request.app.state.store.dashboard.outcome_unknown_effects(execution_id)
        effect = next((e for e in effects if e["step_key"] == res.step), None)
        if effect is None or row["status"] != "parked":
            raise commands.not_outcome_unknown(execution_id, res.step, row["status"], DASHBOARD)
    if res.problems or form.get("confirm") != "yes":
        return render(request, "confirm_resolve.html", {
            "r": row, "res": res, "effect": effect, "now": row["read_at"],
            "by": session.actor, "workers_live": row["workflow_id"] in live,
        }, session=session, status=422 if res.problems else 200)
    await commands.resolve(
        request.app.state.store, execution_id, res.step, res.action, session.actor,
        result=res.result if res.action == "succeed" else commands.NO_RESULT,
        error=res.error, wording=DASHBOARD)
    return back(execution_id, "resolved")


@router.post("/executions/{execution_id}/redrive")
async def redrive(request: Request, execution_id: str) -> Response:
    session, form = await checked_post(request)
    check_id(execution_id, session)
    r = redrive_form(form)
    if r.problems:
        row, _ = await record(request, execution_id, session)
        return redrive_page(request, row, session,
                            await recorded_steps(request, execution_id), r.problems)
    detail = await retry.redrive(
        request.app.state.store, execution_id, session.actor, from_step=r.from_step,
        timeout_seconds=r.timeout_seconds, reason=r.reason, wording=DASHBOARD)
    return RedirectResponse(f"/ui/executions/{pathseg(execution_id)}?done=redriven"
                            f"&redrive={detail.redrive}", status_code=303)


@router.post("/executions/{execution_id}/fork")
async def fork(request: Request, execution_id: str) -> Response:
    session, form = await checked_post(request)
    row, _ = await record(request, execution_id, session)
    f = fork_form(form, request, row)
    if f.problems:
        return await fork_page(request, row, session, f, status=422)
    try:
        detail = await retry.fork(
            request.app.state.store, execution_id, session.actor, from_step=f.from_step,
            new_id=f.new_id or None, params=f.params, admitted_by=session.principal.token_id,
            workflows=request.app.state.workflows, wording=DASHBOARD)
    except CommandError as exc:
        if exc.code != "INVALID_EXECUTION_EVENT":
            raise
        # Params the store cannot hold exactly: shown on the form again.
        f.problems.append(f"{exc.code}: {exc.message}")
        return await fork_page(request, row, session, f, status=422)
    return RedirectResponse(f"/ui/executions/{pathseg(detail.execution_id)}?done=forked",
                            status_code=303)
