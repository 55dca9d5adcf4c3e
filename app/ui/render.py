"""Pages: the templates, the security headers every answer carries, and the
route class that turns every failure into a page (never a JSON error or a
bare 500)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from app.api.errors import RETRY_AFTER_SECONDS
from app.api.json_body import BodyError
from app.commands import CommandError
from app.dberrors import is_infrastructure
from app.schema import STATUSES, TERMINAL_STATUSES
from app.ui import views
from app.ui.errors import LoginRequired, UIError
from app.ui.session import CSRF_COOKIE, Session, secure_cookies

log = logging.getLogger("fencepost.ui")

HERE = Path(__file__).parent

SECURITY_HEADERS = {
    # Nothing from any other origin, no script at all, forms only to ourselves.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

STATIC_FILES = {
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _static_version() -> str:
    digest = hashlib.sha256()
    for name in sorted(STATIC_FILES):
        digest.update((HERE / "static" / name).read_bytes())
    return digest.hexdigest()[:12]


def pathseg(value: str) -> str:
    return quote(str(value), safe="")


templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html", "svg"], default_for_string=True, default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(
    time=views.fmt_time, iso=views.iso, pathseg=pathseg, json_view=views.json_view,
    event_words=views.event_words,
)
templates.globals.update(
    STATIC_VERSION=_static_version(), BLOCKED_REASONS=views.BLOCKED_REASONS,
    relative=views.relative, STATUSES=STATUSES, TERMINAL=TERMINAL_STATUSES,
)


def render(request: Request, template: str, context: dict, *, session: Session | None,
           status: int = 200, headers: dict | None = None) -> HTMLResponse:
    body = templates.get_template(template).render(
        request_path=request.url.path, session=session, **context)
    response = HTMLResponse(body, status_code=status, headers=headers)
    if session is not None and session.new_csrf_seed:
        response.set_cookie(CSRF_COOKIE, session.new_csrf_seed, httponly=True, samesite="strict",
                            path="/ui", secure=secure_cookies(request))
    return response


def error_page(request: Request, exc: UIError) -> HTMLResponse:
    try:
        return render(request, "error.html",
                      {"status": exc.http_status, "code": exc.code, "message": exc.message},
                      session=exc.session, status=exc.http_status, headers=exc.headers)
    except Exception:  # the error page itself must not fail
        log.exception("rendering the error page")
        return HTMLResponse(
            f"<!doctype html><title>{exc.http_status}</title><h1>{exc.http_status}</h1>",
            status_code=exc.http_status)


def back(execution_id: str, done: str) -> RedirectResponse:
    """To the execution's page, with the notice of what was done."""
    return RedirectResponse(f"/ui/executions/{pathseg(execution_id)}?done={done}",
                            status_code=303)


def _as_page(request: Request, exc: CommandError | BodyError) -> UIError:
    if isinstance(exc, UIError):
        return exc
    if isinstance(exc, BodyError):
        return UIError(exc.status, exc.code, exc.message)
    # A command's refusal: shown to the viewer the request was checked for.
    return UIError(exc.http_status, exc.code, exc.message, headers=exc.headers,
                   session=getattr(request.state, "ui_session", None))


class UIRoute(APIRoute):
    """Every UI answer is a page with the security headers; nothing escapes
    as a JSON error or a bare 500."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginRequired as exc:
                target = "/ui/login?" + urlencode(
                    {"next": exc.next_url, **({"reason": exc.reason} if exc.reason else {})})
                response = RedirectResponse(target, status_code=303)
            except (CommandError, BodyError) as exc:
                response = error_page(request, _as_page(request, exc))
            except Exception as exc:
                if not is_infrastructure(exc):  # a bug: a 500 page, logged with its trace
                    log.exception("dashboard error on %s %s", request.method, request.url.path)
                    response = error_page(request, UIError(
                        500, "INTERNAL_ERROR",
                        "the dashboard failed to answer; the server log has the details"))
                else:  # the database failed (app/dberrors.py): 503, try again
                    log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
                    response = error_page(request, UIError(
                        503, "DATABASE_UNAVAILABLE",
                        f"the database is unavailable; retry after {RETRY_AFTER_SECONDS} "
                        "seconds", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}))
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            response.headers.setdefault("Cache-Control", "no-store")
            return response

        return answer
