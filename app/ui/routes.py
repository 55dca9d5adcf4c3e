"""The operator's dashboard: server-rendered pages under /ui.

  GET  /ui                              executions: filters, counts per status, activity chart
  GET  /ui/executions/{id}              one execution: record, blockedBy, steps, events, actions
  GET  /ui/executions/{id}/cancel       confirm a cancel      POST: cancel
  GET  /ui/executions/{id}/terminate    confirm a terminate   POST: terminate
  GET  /ui/executions/{id}/redrive      confirm a redrive     POST: redrive
  GET  /ui/executions/{id}/fork         choose a step to fork from   POST: fork
  POST /ui/executions/{id}/wake         wake now
  POST /ui/executions/{id}/resume       resume one parked as poison or for nondeterminism
  POST /ui/executions/{id}/resolve      review a resolution (confirm=yes: resolve the step)
  GET  /ui/operations                   a bulk operation's form   POST: count or start
  GET  /ui/operations/{id}              its progress              POST .../cancel: stop it
  GET  /ui/queues                       queues: limits, counts, what waits   POST .../pause, .../resume
  GET  /ui/workers                      live and recently dead workers
  GET  /ui/login  POST /ui/login  POST /ui/logout
  GET  /ui/static/{name}                the stylesheet and icon (no other origin is ever asked)

Auth: the API's roles (read views, operate acts; a trigger-only token may not
use the UI), through a server-side session (session.py). Every answer is a
page: errors render the API's error shape (code, message) with its HTTP
status (render.py). Forms POST, act through the operator commands
(app/commands), and redirect (303).

  session.py  who is looking; the checks every acting POST passes
  login.py    sign in and out
  render.py   templates, security headers, every failure as a page
  forms.py    filters and form fields, parsed into values and problems
  pages.py    the listing, one execution, confirmation pages, workers
  actions.py  the acting POSTs on one execution
  bulk.py     bulk operations
  queues.py   the queues page, pause and resume
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.ui import actions, bulk, login, pages, queues
from app.ui.errors import UIError
from app.ui.render import UIRoute
from app.ui.session import CSRF_COOKIE, SESSION_COOKIE, csrf_of

router = APIRouter(route_class=UIRoute)
# Order matters only for the catch-all below, which comes last.
for part in (login, pages, actions, bulk, queues):
    router.include_router(part.router, prefix="/ui", include_in_schema=False)


@router.api_route("/ui/{rest:path}", include_in_schema=False, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_found_page(request: Request, rest: str) -> Response:
    if rest == "" and request.method == "GET":
        return RedirectResponse("/ui", status_code=307)
    raise UIError(404, "NOT_FOUND", "no such page; the dashboard starts at /ui")


_csrf_of = csrf_of  # the name tests derive a form's CSRF field with
__all__ = ["CSRF_COOKIE", "SESSION_COOKIE", "_csrf_of", "router"]
