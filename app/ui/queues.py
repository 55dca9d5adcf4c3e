"""The queues page: each queue's effective limits (and whether code declared
them or an operator set them at run time), what it runs, what is due and what
its limits hold back, the executions waiting on it (in claim order, with
their blockedBy in words); and the pause and resume POSTs (role operate,
checked like every acting POST, carried out by app/commands/queues.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.blocked import blocked_by
from app.commands import queues as commands
from app.commands.errors import UNSTORABLE_TEXT
from app.ui import views
from app.ui.errors import UIError
from app.ui.pages import live
from app.ui.render import UIRoute, render
from app.ui.session import checked_post, viewer

router = APIRouter(route_class=UIRoute)

WAITING_SHOWN = 20

DONE_MESSAGES = {
    "paused": "Paused: nothing more of the queue is claimed; what runs goes on.",
    "resumed": "Resumed: its due executions are claimed again, within its limits.",
}


@dataclass(frozen=True)
class Limit:
    label: str
    value: str  # in words ("no limit" when unset)
    source: str  # "run time", "code" or "" (neither sets it)


def _source(row: dict[str, Any], *keys: str) -> str:
    if any(k in row["override"] for k in keys):
        return "run time"
    if any(k in row["declared"] for k in keys):
        return "code"
    return ""


def limits(row: dict[str, Any]) -> list[Limit]:
    """The effective settings of one queue row (store.dashboard.queues), in words."""
    def count(value: int | None) -> str:
        return "no limit" if value is None else str(value)

    rate = "no limit"
    if row["rate_limit"] is not None:
        rate = (f"{row['rate_limit']} starts per {row['rate_period']:g} s"
                + (" per key" if row["rate_per_key"] else ""))
    return [
        Limit("Concurrency", count(row["concurrency"]), _source(row, "concurrency")),
        Limit("Per-key concurrency", count(row["per_key_concurrency"]),
              _source(row, "per_key_concurrency")),
        Limit("Rate limit", rate, _source(row, "rate_limit", "rate_period", "rate_per_key")),
        Limit("Suspended executions hold their slot",
              "yes" if row["hold_while_suspended"] else "no",
              _source(row, "hold_while_suspended")),
    ]


def _check_name(name: str) -> None:
    if UNSTORABLE_TEXT.search(name) or len(name) > 1000:
        raise commands.queue_not_found(name[:200])


@router.get("/queues")
async def queues_page(request: Request) -> Response:
    session = await viewer(request)
    store = request.app.state.store
    live_ids = await live(request)
    queues = await store.dashboard.queues()
    waiting: dict[str, list[dict[str, Any]]] = {}
    for q in queues:
        rows = []
        if q["due"]:
            rows = await store.dashboard.queue_waiting(
                q["name"], live_workflows=live_ids, limit=WAITING_SHOWN)
        for row in rows:
            row["blocked"] = views.explain_blocked(blocked_by(row, live_ids), row)
        waiting[q["name"]] = rows
    now = await store.clock.db_now()
    return render(request, "queues.html", {
        "queues": queues, "limits": {q["name"]: limits(q) for q in queues},
        "waiting": waiting, "shown": WAITING_SHOWN, "now": now,
        "notice": DONE_MESSAGES.get(request.query_params.get("done", "")),
    }, session=session)


async def _pause_or_resume(request: Request, name: str, pause: bool) -> Response:
    session, _ = await checked_post(request)
    _check_name(name)
    store = request.app.state.store
    if await store.queues.get(name) is None:
        exc = commands.queue_not_found(name)
        raise UIError(exc.http_status, exc.code, exc.message, session=session)
    if pause:
        await commands.pause(store, name, session.actor)
    else:
        await commands.resume(store, name, session.actor)
    done = "paused" if pause else "resumed"
    return RedirectResponse(f"/ui/queues?done={done}", status_code=303)


@router.post("/queues/{name}/pause")
async def pause(request: Request, name: str) -> Response:
    return await _pause_or_resume(request, name, True)


@router.post("/queues/{name}/resume")
async def resume(request: Request, name: str) -> Response:
    return await _pause_or_resume(request, name, False)


@router.get("/queues/{name}/{action}")
async def action_by_get(request: Request, name: str, action: str) -> Response:
    """Pause and resume are POSTs; a bookmarked or reloaded one shows the queues."""
    if action not in ("pause", "resume"):
        raise UIError(404, "NOT_FOUND", "no such page; the dashboard starts at /ui")
    return RedirectResponse("/ui/queues", status_code=303)
