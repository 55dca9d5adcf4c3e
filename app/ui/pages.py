"""The pages that show: the executions listing, one execution, the
confirmation pages before an action, the workers, the static files."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.blocked import blocked_by, workflows_of
from app.commands.errors import UNSTORABLE_TEXT
from app.commands.executions import terminal
from app.commands.redrive import not_ended
from app.schema import TERMINAL_STATUSES
from app.store.redrive import REDRIVABLE
from app.store.ui import UI_SORTS
from app.ui import views
from app.ui.errors import UIError, not_found
from app.ui.forms import PAGE_SIZES, ForkForm, filters, form_time, whole_number
from app.ui.render import HERE, STATIC_FILES, UIRoute, pathseg, render
from app.ui.session import Session, viewer

router = APIRouter(route_class=UIRoute)

STEPS_SHOWN = 500
EVENTS_PER_PAGE = 200

SORT_LABELS = {
    "admitted-desc": "newest first",
    "admitted-asc": "oldest first",
    "unacked-desc": "most unacknowledged deliveries",
    "updated-desc": "recently updated",
    "deadline-asc": "nearest deadline",
}
assert set(SORT_LABELS) == set(UI_SORTS)

DONE_MESSAGES = {
    "cancelled": "Cancelled.",
    "cancel-requested": "Cancel requested: its cleanup code runs at its next step or wait, "
                        "then it ends cancelled.",
    "woken": "Wake requested: it is due now.",
    "wake-ignored": "It has already ended: there is nothing to wake.",
    "resumed": "Resumed: it is due again.",
    "resolved": "Step resolved: the execution is due now and a worker will continue it.",
    "terminated": "Terminated: it ended cancelled at once; no code ran.",
}


def check_id(execution_id: str, session: Session) -> None:
    """An ID no stored execution can have is not found, without a query."""
    if UNSTORABLE_TEXT.search(execution_id) or len(execution_id) > 1000:
        raise not_found(execution_id[:200], session)


async def live(request: Request) -> set[str]:
    settings = request.app.state.settings
    return await request.app.state.store.history.live_workflow_ids(3 * settings.renew_seconds + 1)


async def record(request: Request, execution_id: str, session: Session) -> tuple[dict, set[str]]:
    check_id(execution_id, session)
    row = await request.app.state.store.history.get(execution_id)
    if row is None:
        raise not_found(execution_id, session)
    return row, await live(request)


async def recorded_steps(request: Request, execution_id: str) -> list[dict]:
    """The steps in the record (not effects in doubt, not superseded ones), in
    recorded order: the choices for fromStep."""
    rows = await request.app.state.store.history.execution_steps_page(
        execution_id, include_values=False, limit=STEPS_SHOWN + 1) or []
    return [s for s in rows if s["grp"] == 0]


# ------------------------------------------------------------------ static


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media = STATIC_FILES.get(name)
    if media is None:
        raise UIError(404, "NOT_FOUND", "no such file")
    return Response((HERE / "static" / name).read_bytes(), media_type=media,
                    headers={"Cache-Control": "public, max-age=86400"})


# -------------------------------------------------------------- executions


@router.get("")
async def executions_page(request: Request) -> Response:
    session = await viewer(request)
    store = request.app.state.store
    f = filters(request)
    counts = await store.dashboard.status_counts()
    now, activity = await store.dashboard.activity_per_minute(60)
    live_ids = await live(request)
    # The filter's choices: workflows, not the versions carried of them.
    workflow_ids = sorted(set(await store.dashboard.workflow_ids_seen()) | workflows_of(live_ids))
    rows: list[dict] = []
    total = 0
    if not f.problems:
        rows, total = await store.dashboard.ui_list(
            live_workflows=live_ids, status=f.status, workflow_id=f.workflow_id,
            min_unacknowledged_deliveries=f.min_unacked, blocked_by=f.blocked_by,
            admitted_from=f.admitted_from, admitted_to=f.admitted_to, sort=f.sort,
            offset=(f.page - 1) * f.limit, limit=f.limit,
        )
    for row in rows:
        row["blocked"] = views.explain_blocked(blocked_by(row, live_ids), row)
    pages = max(1, -(-total // f.limit))
    return render(request, "executions.html", {
        "f": f, "refresh": f.refresh, "rows": rows, "total": total, "pages": pages, "counts": counts,
        "all_count": sum(counts.values()), "now": now, "chart": views.activity_chart(activity),
        "series": views.SERIES, "workflow_ids": workflow_ids, "sorts": SORT_LABELS,
        "page_sizes": PAGE_SIZES,
        "registered": sorted(set(request.app.state.workflows or {}) | workflows_of(live_ids)),
        "filtered": bool(set(f.raw) - {"refresh", "sort", "limit"}),
        "form_from": form_time(f.admitted_from, f.raw.get("admittedFrom")),
        "form_to": form_time(f.admitted_to, f.raw.get("admittedTo")),
    }, session=session, status=422 if f.problems else 200)


# ----------------------------------------------------------- one execution


@router.get("/executions/{execution_id}")
async def execution_page(request: Request, execution_id: str) -> Response:
    session = await viewer(request)
    store = request.app.state.store
    row, live_ids = await record(request, execution_id, session)
    after_raw = request.query_params.get("eventsAfter", "0")
    problems: list[str] = []
    after = whole_number("eventsAfter", after_raw, 0, 2**63 - 1, problems) or 0
    events = await store.history.events_page(execution_id, after=after, limit=EVENTS_PER_PAGE + 1)
    more_events = len(events) > EVENTS_PER_PAGE
    events = events[:EVENTS_PER_PAGE]
    # Recorded steps, effects in doubt, then the steps redrives superseded.
    steps = await store.history.execution_steps_page(
        execution_id, include_values=True, limit=STEPS_SHOWN + 1) or []
    unknown = await store.dashboard.outcome_unknown_effects(execution_id)
    blocked = blocked_by(row, live_ids)
    done = request.query_params.get("done", "")
    notice = DONE_MESSAGES.get(done)
    if done == "redriven":
        notice = _redriven_notice(request.query_params.get("redrive", ""), steps)
    elif done == "forked" and row["forked_from"]:
        notice = (f"Forked from {row['forked_from']} at step “{row['forked_from_step']}”: the "
                  "steps recorded before it were copied; that step and the rest run under "
                  "this ID.")
    return render(request, "execution.html", {
        "r": row, "blocked": views.explain_blocked(blocked, row), "blocked_raw": blocked,
        "now": row["read_at"], "steps": steps[:STEPS_SHOWN], "steps_more": len(steps) > STEPS_SHOWN,
        "recorded_steps": any(s["grp"] == 0 for s in steps),
        "events": events, "more_events": more_events, "events_after": after,
        "next_after": events[-1]["event_id"] if events else after,
        "late": await store.history.late_observations(execution_id),
        "unknown": unknown if row["status"] == "parked" else [],
        "notice": notice, "problems": problems,
        "workers_live": row["workflow_id"] in live_ids,
        "max_unacked": await _applied_poison_threshold(request),
    }, session=session)


def _redriven_notice(raw: str, steps: list[dict]) -> str:
    """Which steps redrive number `raw` superseded, from the superseded history."""
    n = whole_number("redrive", raw, 1, 2**31 - 1, [])
    if n is None:
        return "Redriven: a worker continues it now."
    keys = [s["step_key"] for s in steps if s["grp"] == 2 and s["redrive"] == n]
    if keys:
        return (f"Redriven (redrive {n}): step{'s' if len(keys) > 1 else ''} "
                f"{', '.join(keys)} superseded and run again; the steps recorded before "
                "replay. A worker continues it now.")
    return (f"Redriven (redrive {n}): no recorded step was superseded; the recorded steps "
            "replay. A worker continues it now.")


async def _applied_poison_threshold(request: Request) -> int:
    """The poison threshold every process applies: the stored shared value
    (each api and worker refuses to start with another), this process's own
    only while none is stored yet."""
    stored = await request.app.state.store.settings.shared_settings()
    row = stored.get("max_unacknowledged_deliveries")
    if row is None:
        return request.app.state.settings.max_unacknowledged_deliveries
    return int(row.value)


# ------------------------------------------------------ confirmation pages


async def _confirm_end(request: Request, execution_id: str, what: str) -> Response:
    """Confirm a cancel or a terminate: refused for an execution that ended."""
    session = await viewer(request, need="operate")
    row, live_ids = await record(request, execution_id, session)
    if row["status"] in TERMINAL_STATUSES:
        raise terminal(execution_id, row["status"], what)
    return render(request, f"confirm_{what}.html", {
        "r": row, "now": row["read_at"], "by": session.actor,
        "blocked": views.explain_blocked(blocked_by(row, live_ids), row),
        "held": row["status"] == "running",
    }, session=session)


@router.get("/executions/{execution_id}/cancel")
async def cancel_page(request: Request, execution_id: str) -> Response:
    return await _confirm_end(request, execution_id, "cancel")


@router.get("/executions/{execution_id}/terminate")
async def terminate_page(request: Request, execution_id: str) -> Response:
    return await _confirm_end(request, execution_id, "terminate")


def redrive_page(request: Request, row: dict, session: Session, steps: list[dict],
                 problems: list[str]) -> Response:
    return render(request, "confirm_redrive.html", {
        "r": row, "now": row["read_at"], "by": session.actor, "steps": steps,
        "problems": problems,
    }, session=session, status=422 if problems else 200)


@router.get("/executions/{execution_id}/redrive")
async def redrive_confirm(request: Request, execution_id: str) -> Response:
    session = await viewer(request, need="operate")
    row, _ = await record(request, execution_id, session)
    if row["status"] not in REDRIVABLE:
        raise not_ended(execution_id, row["status"])
    return redrive_page(request, row, session, await recorded_steps(request, execution_id), [])


async def fork_page(request: Request, row: dict, session: Session, f: ForkForm,
                    status: int = 200) -> Response:
    steps = await recorded_steps(request, row["execution_id"])
    if not steps:
        raise UIError(409, "NO_RECORDED_STEP",
                      f"execution {row['execution_id']!r} has no recorded step to fork from; "
                      "admit a new execution instead", session=session)
    return render(request, "confirm_fork.html", {
        "r": row, "now": row["read_at"], "by": session.actor, "steps": steps, "f": f,
    }, session=session, status=status)


@router.get("/executions/{execution_id}/fork")
async def fork_confirm(request: Request, execution_id: str) -> Response:
    session = await viewer(request, need="operate")
    row, _ = await record(request, execution_id, session)
    return await fork_page(request, row, session, ForkForm())


@router.get("/executions/{execution_id}/{action}")
async def action_by_get(request: Request, execution_id: str, action: str) -> Response:
    """Actions are POSTs; a bookmarked or reloaded action URL shows the execution."""
    if action not in ("wake", "resume", "resolve"):
        raise UIError(404, "NOT_FOUND", "no such page; the dashboard starts at /ui")
    return RedirectResponse(f"/ui/executions/{pathseg(execution_id)}", status_code=303)


# ----------------------------------------------------------------- workers


@router.get("/workers")
async def workers_page(request: Request) -> Response:
    session = await viewer(request)
    store = request.app.state.store
    settings = request.app.state.settings
    stale = 3 * settings.renew_seconds + 1
    workers = await store.workers.list_workers(stale_after_seconds=stale)
    leases = await store.dashboard.leases_by_owner()
    roles: dict[str, list[str]] = {}
    for term in await store.maintenance.leaders():  # unexpired terms, by role
        roles.setdefault(term.holder, []).append(term.role)
    now = await store.clock.db_now()
    return render(request, "workers.html", {
        "workers": workers, "leases": leases, "roles": roles, "now": now, "stale": stale,
        "alive": sum(1 for w in workers if w["alive"]),
    }, session=session)

