"""The operator's dashboard: server-rendered pages under /ui.

  GET  /ui                              executions: filters, counts per status, activity chart
  GET  /ui/executions/{id}              one execution: record, blockedBy, steps, events, actions
  GET  /ui/executions/{id}/cancel       confirm a cancel      POST: cancel
  POST /ui/executions/{id}/wake         wake now
  POST /ui/executions/{id}/resume       resume a poison-parked execution
  POST /ui/executions/{id}/resolve      review a resolution (confirm=yes: resolve the step)
  GET  /ui/workers                      live and recently dead workers
  GET  /ui/login  POST /ui/login  POST /ui/logout
  GET  /ui/static/{name}                the stylesheet and icon (no other origin is ever asked)

Auth: the API's roles (read views, operate acts; a trigger-only token may not
use the UI). Signing in with an API token opens a server-side session: the
browser keeps only a random 256-bit session ID (HttpOnly, SameSite=Strict,
Path=/ui, Secure unless FENCEPOST_COOKIE_SECURE=false), the server only its
SHA-256 (ui_sessions, app/store/sessions.py). Every page reads the session in
one statement with its token: it works until it expires
(FENCEPOST_SESSION_SECONDS), is signed out, or its token is revoked, whichever
comes first; the cookie is never usable as an API token. POSTs are checked
against cross-site requests twice: Origin/Sec-Fetch-Site, and a form field
derived (HMAC) from the session ID. With FENCEPOST_AUTH=disabled there is no
login; the form field is then derived from a random cookie.

Every answer is a page: errors render the API's error shape (code, message)
with its HTTP status. Forms POST, act through the store, and redirect (303).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from app.api.auth import ANONYMOUS, Principal, principal_of
from app.api.common import registered_workflow
from app.api.errors import RETRY_AFTER_SECONDS, ApiError
from app.api.ids import check_client_execution_id
from app.api.json_body import BodyError, parse_json, read_body
from app.api.limits import LOOPBACK_HOSTS, host_name
from app.api.models import EXECUTION_ID_PATTERN
from app.api.routes.redrive import fork_id
from app.blocked import blocked_by
from app.dberrors import is_infrastructure
from app.logs import operator_action
from app.registry import ID_RE
from app.schema import STATUSES, TERMINAL_STATUSES
from app.store import InvalidEvent
from app.store.bulk import ACTIONS as BULK_ACTIONS
from app.store.redrive import REDRIVABLE
from app.store.ui import UI_SORTS
from app.ui import views

log = logging.getLogger("fencepost.ui")

HERE = Path(__file__).parent
SESSION_COOKIE = "fencepost_ui_session"
LEGACY_TOKEN_COOKIE = "fencepost_ui_token"  # held the raw token before sessions: cleared at sign-in
CSRF_COOKIE = "fencepost_ui_csrf"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32): 256 bits
PAGE_SIZES = (25, 50, 100, 200)
MAX_PAGE = 10_000
STEPS_SHOWN = 500
EVENTS_PER_PAGE = 200
_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")

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

STATIC_FILES = {
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _static_version() -> str:
    digest = hashlib.sha256()
    for name in sorted(STATIC_FILES):
        digest.update((HERE / "static" / name).read_bytes())
    return digest.hexdigest()[:12]


def _pathseg(value: str) -> str:
    return quote(str(value), safe="")


templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html", "svg"], default_for_string=True, default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(
    time=views.fmt_time, iso=views.iso, pathseg=_pathseg, json_view=views.json_view,
    event_words=views.event_words,
)
templates.globals.update(
    STATIC_VERSION=_static_version(), BLOCKED_REASONS=views.BLOCKED_REASONS,
    relative=views.relative, STATUSES=STATUSES, TERMINAL=TERMINAL_STATUSES,
)


# ------------------------------------------------------------------ errors


class UIError(Exception):
    """Rendered as the error page: the API's error shape, as a page."""

    def __init__(self, status: int, code: str, message: str, *, session: Session | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.session, self.headers = session, headers


class LoginRequired(Exception):
    def __init__(self, next_url: str, reason: str | None = None):
        self.next_url, self.reason = next_url, reason


def _not_found(execution_id: str, session: Session | None = None) -> UIError:
    return UIError(404, "EXECUTION_NOT_FOUND",
                   f"no execution with ID {execution_id!r}; check the ID", session=session)


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
            except UIError as exc:
                response = _error_page(request, exc)
            except (ApiError, BodyError) as exc:
                status = exc.http_status if isinstance(exc, ApiError) else exc.status
                response = _error_page(request, UIError(status, exc.code, exc.message))
            except Exception as exc:
                if not is_infrastructure(exc):  # a bug: a 500 page, logged with its trace
                    log.exception("dashboard error on %s %s", request.method, request.url.path)
                    response = _error_page(request, UIError(
                        500, "INTERNAL_ERROR",
                        "the dashboard failed to answer; the server log has the details"))
                else:  # the database failed (app/dberrors.py): 503, try again
                    log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
                    response = _error_page(request, UIError(
                        503, "DATABASE_UNAVAILABLE",
                        f"the database is unavailable; retry after {RETRY_AFTER_SECONDS} "
                        "seconds", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}))
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            response.headers.setdefault("Cache-Control", "no-store")
            return response

        return answer


router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)


# -------------------------------------------------------------------- auth


@dataclass
class Session:
    principal: Principal
    auth: bool
    csrf: str
    new_csrf_seed: str | None = None  # to set as CSRF_COOKIE (auth disabled)
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def may_operate(self) -> bool:
        return self.principal.may("operate")


def _csrf_of(seed: str) -> str:
    return hmac.new(seed.encode(), b"fencepost-ui-csrf", hashlib.sha256).hexdigest()


def _session_digest(session_id: str) -> str:
    """What ui_sessions stores of a session ID: its SHA-256 (the ID is 256
    random bits, so a fast hash is enough)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _here(request: Request) -> str:
    path = request.url.path
    return path + ("?" + request.url.query if request.url.query else "")


async def _session(request: Request, *, need: str = "read") -> Session:
    """The viewer, or LoginRequired / UIError(403)."""
    if request.app.state.settings.auth == "disabled":
        seed = request.cookies.get(CSRF_COOKIE, "")
        new_seed = None
        if not re.fullmatch(r"[A-Za-z0-9_-]{32,64}", seed):
            seed = new_seed = secrets.token_urlsafe(32)
        session = Session(ANONYMOUS, False, _csrf_of(seed), new_seed)
    else:
        session_id = request.cookies.get(SESSION_COOKIE, "")
        next_url = _here(request) if request.method == "GET" else "/ui"
        if not session_id:
            raise LoginRequired(next_url)
        if not _SESSION_ID.fullmatch(session_id):  # not one we issued: no query
            raise LoginRequired(next_url, "unknown")
        state, row = await request.app.state.store.find_ui_session(_session_digest(session_id))
        if row is None:
            raise LoginRequired(next_url, state)
        session = Session(principal_of(row), True, _csrf_of(session_id))
    principal = session.principal
    if not principal.may("read", "operate"):
        raise UIError(403, "FORBIDDEN",
                      f"the dashboard needs a token with role read or operate; token "
                      f"{principal.name!r} has {', '.join(sorted(principal.roles))}")
    if need == "operate" and not principal.may("operate"):
        raise UIError(403, "FORBIDDEN",
                      f"this needs a token with role operate; token {principal.name!r} has "
                      f"{', '.join(sorted(principal.roles))}", session=session)
    return session


def _same_origin(request: Request) -> bool:
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True  # older clients: the form token still has to match
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form fields (first value of each)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise UIError(415, "UNSUPPORTED_MEDIA_TYPE",
                      "send the form as application/x-www-form-urlencoded")
    settings = request.app.state.settings
    raw = await read_body(request, settings.max_payload_bytes, settings.body_timeout_seconds)
    try:
        fields = parse_qs(raw.decode("ascii"), keep_blank_values=True, max_num_fields=50,
                          strict_parsing=False, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise UIError(400, "INVALID_REQUEST", "the form is not valid; reload the page") from None
    return {k: v[0] for k, v in fields.items()}


async def _checked_post(request: Request) -> tuple[Session, dict[str, str]]:
    """An operate session and its form, refused when it comes from another site."""
    if not _same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST",
                      "this form was sent from another site; open the dashboard and try again")
    session = await _session(request, need="operate")
    form = await _form(request)
    if not hmac.compare_digest(form.get("csrf", ""), session.csrf):
        raise UIError(403, "CSRF_TOKEN_MISMATCH",
                      "the form is out of date (or was not sent from the dashboard); "
                      "reload the page and try again", session=session)
    return session, form


def _actor(session: Session) -> str:
    return session.principal.name


# --------------------------------------------------------------- rendering


def _render(request: Request, template: str, context: dict, *, session: Session | None,
            status: int = 200, headers: dict | None = None) -> HTMLResponse:
    body = templates.get_template(template).render(
        request_path=request.url.path, session=session, **context)
    response = HTMLResponse(body, status_code=status, headers=headers)
    if session is not None and session.new_csrf_seed:
        response.set_cookie(CSRF_COOKIE, session.new_csrf_seed, httponly=True, samesite="strict",
                            path="/ui", secure=_secure_cookies(request))
    return response


def _error_page(request: Request, exc: UIError) -> HTMLResponse:
    try:
        return _render(request, "error.html",
                       {"status": exc.status, "code": exc.code, "message": exc.message},
                       session=exc.session, status=exc.status, headers=exc.headers)
    except Exception:  # the error page itself must not fail
        log.exception("rendering the error page")
        return HTMLResponse(f"<!doctype html><title>{exc.status}</title><h1>{exc.status}</h1>",
                            status_code=exc.status)


def _check_id(execution_id: str, session: Session) -> None:
    if _UNSTORABLE_TEXT.search(execution_id) or len(execution_id) > 1000:
        raise _not_found(execution_id[:200], session)


async def _live(request: Request) -> set[str]:
    settings = request.app.state.settings
    return await request.app.state.store.live_workflow_ids(3 * settings.renew_seconds + 1)


# ------------------------------------------------------------------ static


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media = STATIC_FILES.get(name)
    if media is None:
        raise UIError(404, "NOT_FOUND", "no such file")
    return Response((HERE / "static" / name).read_bytes(), media_type=media,
                    headers={"Cache-Control": "public, max-age=86400"})


# ------------------------------------------------------------------- login


def _secure_cookies(request: Request) -> bool:
    return request.app.state.settings.cookie_secure


def _cookie_will_be_dropped(request: Request) -> bool:
    """A Secure cookie sent over plain HTTP to a name other than loopback:
    the browser will not keep it, so signing in would only loop."""
    return (_secure_cookies(request) and request.url.scheme != "https"
            and host_name(request.headers.get("host", "")) not in LOOPBACK_HOSTS)


INSECURE_NOTICE = (
    "This page came over plain HTTP, and the sign-in cookie is Secure (HTTPS only): your "
    "browser will not keep it. Open the dashboard through HTTPS; if a TLS proxy is in front, "
    "list its address in FENCEPOST_FORWARDED_ALLOW_IPS. For local development only, "
    "FENCEPOST_COOKIE_SECURE=false."
)


def _safe_next(value: str | None) -> str:
    """Only a path of this dashboard: never another site."""
    if not value or not value.startswith("/ui") or value.startswith("//") or "\\" in value:
        return "/ui"
    if _UNSTORABLE_TEXT.search(value) or any(ord(c) < 32 for c in value):
        return "/ui"
    return value


LOGIN_REASONS = {
    "revoked": "Your token was revoked; sign in with another.",
    "expired": "Your session expired; sign in again.",
    "ended": "That session was signed out; sign in again.",
    "unknown": "Your session is not known here (it ended, or was never issued); sign in again.",
    "signed-out": "Signed out.",
}


@router.get("/login")
async def login_page(request: Request) -> Response:
    if request.app.state.settings.auth == "disabled":
        return RedirectResponse("/ui", status_code=303)
    return _render(request, "login.html", {
        "next": _safe_next(request.query_params.get("next")),
        "notice": LOGIN_REASONS.get(request.query_params.get("reason", "")),
        "error": None, "insecure": INSECURE_NOTICE if _cookie_will_be_dropped(request) else None,
    }, session=None)


@router.post("/login")
async def login(request: Request) -> Response:
    if request.app.state.settings.auth == "disabled":
        return RedirectResponse("/ui", status_code=303)
    if not _same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST", "sign in from the dashboard's own login page")
    form = await _form(request)
    next_url = _safe_next(form.get("next"))
    token = form.get("token", "").strip()
    if token.lower().startswith("bearer "):
        token = token[7:].strip()
    principal = None
    if token and len(token) <= 500 and re.fullmatch(r"[A-Za-z0-9_-]+", token):
        principal = await request.app.state.verifier.verify(token)
    insecure = INSECURE_NOTICE if _cookie_will_be_dropped(request) else None
    if principal is not None and not principal.may("read", "operate"):
        return _render(request, "login.html", {
            "next": next_url, "notice": None, "insecure": insecure,
            "error": ("FORBIDDEN", f"token {principal.name!r} has role "
                      f"{', '.join(sorted(principal.roles))}; the dashboard needs read or operate"),
        }, session=None, status=403)
    settings = request.app.state.settings
    session_id = secrets.token_urlsafe(32)
    if principal is None or not await request.app.state.store.create_ui_session(
            _session_digest(session_id), principal.token_id, settings.session_seconds):
        return _render(request, "login.html", {
            "next": next_url, "notice": None, "insecure": insecure,
            "error": ("UNAUTHENTICATED", "the API token is unknown or revoked; create one with "
                      "`fencepost tokens create --role read --name NAME`"),
        }, session=None, status=401)
    response = RedirectResponse(next_url, status_code=303)
    # The cookie holds the session ID, never the token.
    response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict",
                        path="/ui", secure=_secure_cookies(request),
                        max_age=max(1, int(settings.session_seconds)))
    if LEGACY_TOKEN_COOKIE in request.cookies:
        response.delete_cookie(LEGACY_TOKEN_COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not _same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST", "sign out from the dashboard itself")
    session_id = request.cookies.get(SESSION_COOKIE, "")
    if request.app.state.settings.auth != "disabled" and _SESSION_ID.fullmatch(session_id):
        await request.app.state.store.end_ui_session(_session_digest(session_id))
    response = RedirectResponse("/ui/login?reason=signed-out", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/ui", httponly=True, samesite="strict",
                           secure=_secure_cookies(request))
    return response


# -------------------------------------------------------------- executions


@dataclass
class Filters:
    status: str | None = None
    workflow_id: str | None = None
    min_unacked: int | None = None
    blocked_by: str | None = None
    admitted_from: datetime | None = None
    admitted_to: datetime | None = None
    sort: str = "admitted-desc"
    page: int = 1
    limit: int = 50
    refresh: int | None = None
    raw: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def url(self, **changes: Any) -> str:
        """This listing's URL with some parameters changed (None: removed)."""
        params = {k: v for k, v in self.raw.items() if v != ""}
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = str(value)
        if changes.keys() - {"page"}:
            params.pop("page", None)  # a new filter starts on page 1
        return "/ui" + ("?" + urlencode(params) if params else "")


FILTER_KEYS = ("status", "workflowId", "minUnacknowledgedDeliveries", "blockedBy",
               "admittedFrom", "admittedTo", "sort", "page", "limit", "refresh")


def _parse_time(name: str, value: str, problems: list[str]) -> datetime | None:
    try:
        at = datetime.fromisoformat(value)
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)  # the form's times are UTC
        return at.astimezone(UTC)
    except (ValueError, OverflowError):
        problems.append(f"{name}: give a time like 2026-01-31T14:00 (UTC) or with an offset")
        return None


def _int(name: str, value: str, low: int, high: int, problems: list[str]) -> int | None:
    if not re.fullmatch(r"\d{1,10}", value) or not low <= int(value) <= high:
        problems.append(f"{name}: give a whole number from {low} to {high}")
        return None
    return int(value)


def _filters(request: Request) -> Filters:
    q = request.query_params
    raw = {k: q.get(k, "").strip() for k in FILTER_KEYS if q.get(k, "").strip()}
    f = Filters(raw=raw)
    p = f.problems
    if v := raw.get("status"):
        if v in STATUSES:
            f.status = v
        else:
            p.append(f"status: one of {', '.join(STATUSES)}")
    if v := raw.get("workflowId"):
        if ID_RE.match(v):
            f.workflow_id = v
        else:
            p.append("workflowId: 1 to 200 characters from A-Z a-z 0-9 . _ : -")
    if v := raw.get("minUnacknowledgedDeliveries"):
        f.min_unacked = _int("minUnacknowledgedDeliveries", v, 0, 2**31 - 1, p)
    if v := raw.get("blockedBy"):
        if v in views.BLOCKED_REASONS:
            f.blocked_by = v
        else:
            p.append(f"blockedBy: one of {', '.join(views.BLOCKED_REASONS)}")
    if v := raw.get("admittedFrom"):
        f.admitted_from = _parse_time("admittedFrom", v, p)
    if v := raw.get("admittedTo"):
        f.admitted_to = _parse_time("admittedTo", v, p)
    if v := raw.get("sort"):
        if v in UI_SORTS:
            f.sort = v
        else:
            p.append(f"sort: one of {', '.join(UI_SORTS)}")
    if v := raw.get("page"):
        f.page = _int("page", v, 1, MAX_PAGE, p) or 1
    if v := raw.get("limit"):
        if v in {str(n) for n in PAGE_SIZES}:
            f.limit = int(v)
        else:
            p.append(f"limit: one of {', '.join(map(str, PAGE_SIZES))}")
    if v := raw.get("refresh"):
        if v in ("5", "15", "60"):
            f.refresh = int(v)
        else:
            p.append("refresh: 5, 15 or 60 seconds")
    return f


def _form_time(value: datetime | None, raw: str | None) -> str:
    """What a datetime-local input can show again."""
    if value is None:
        return raw or ""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


@router.get("")
async def executions_page(request: Request) -> Response:
    session = await _session(request)
    store = request.app.state.store
    f = _filters(request)
    counts = await store.status_counts()
    now, activity = await store.activity_per_minute(60)
    live = await _live(request)
    workflow_ids = sorted(set(await store.workflow_ids_seen()) | live)
    rows: list[dict] = []
    total = 0
    if not f.problems:
        rows, total = await store.ui_list(
            live_workflows=live, status=f.status, workflow_id=f.workflow_id,
            min_unacknowledged_deliveries=f.min_unacked, blocked_by=f.blocked_by,
            admitted_from=f.admitted_from, admitted_to=f.admitted_to, sort=f.sort,
            offset=(f.page - 1) * f.limit, limit=f.limit,
        )
    for row in rows:
        row["blocked"] = views.explain_blocked(blocked_by(row, live), row)
    pages = max(1, -(-total // f.limit))
    return _render(request, "executions.html", {
        "f": f, "refresh": f.refresh, "rows": rows, "total": total, "pages": pages, "counts": counts,
        "all_count": sum(counts.values()), "now": now, "chart": views.activity_chart(activity),
        "series": views.SERIES, "workflow_ids": workflow_ids, "sorts": SORT_LABELS,
        "page_sizes": PAGE_SIZES,
        "registered": sorted(set(request.app.state.workflows or {}) | live),
        "filtered": bool(set(f.raw) - {"refresh", "sort", "limit"}),
        "form_from": _form_time(f.admitted_from, f.raw.get("admittedFrom")),
        "form_to": _form_time(f.admitted_to, f.raw.get("admittedTo")),
    }, session=session, status=422 if f.problems else 200)


# ---------------------------------------------------------------- one execution


async def _record(request: Request, execution_id: str, session: Session) -> tuple[dict, set[str]]:
    _check_id(execution_id, session)
    row = await request.app.state.store.get(execution_id)
    if row is None:
        raise _not_found(execution_id, session)
    return row, await _live(request)


@router.get("/executions/{execution_id}")
async def execution_page(request: Request, execution_id: str) -> Response:
    session = await _session(request)
    store = request.app.state.store
    row, live = await _record(request, execution_id, session)
    after_raw = request.query_params.get("eventsAfter", "0")
    problems: list[str] = []
    after = _int("eventsAfter", after_raw, 0, 2**63 - 1, problems) or 0
    events = await store.events_page(execution_id, after=after, limit=EVENTS_PER_PAGE + 1)
    more_events = len(events) > EVENTS_PER_PAGE
    events = events[:EVENTS_PER_PAGE]
    # Recorded steps, effects in doubt, then the steps redrives superseded.
    steps = await store.execution_steps_page(
        execution_id, include_values=True, limit=STEPS_SHOWN + 1) or []
    unknown = await store.outcome_unknown_effects(execution_id)
    blocked = blocked_by(row, live)
    done = request.query_params.get("done", "")
    notice = DONE_MESSAGES.get(done)
    if done == "redriven":
        notice = _redriven_notice(request.query_params.get("redrive", ""), steps)
    elif done == "forked" and row["forked_from"]:
        notice = (f"Forked from {row['forked_from']} at step “{row['forked_from_step']}”: the "
                  "steps recorded before it were copied; that step and the rest run under "
                  "this ID.")
    return _render(request, "execution.html", {
        "r": row, "blocked": views.explain_blocked(blocked, row), "blocked_raw": blocked,
        "now": row["read_at"], "steps": steps[:STEPS_SHOWN], "steps_more": len(steps) > STEPS_SHOWN,
        "recorded_steps": any(s["grp"] == 0 for s in steps),
        "events": events, "more_events": more_events, "events_after": after,
        "next_after": events[-1]["event_id"] if events else after,
        "late": await store.late_observations(execution_id),
        "unknown": unknown if row["status"] == "parked" else [],
        "notice": notice, "problems": problems,
        "workers_live": row["workflow_id"] in live,
        "max_unacked": await _applied_poison_threshold(request),
    }, session=session)


def _redriven_notice(raw: str, steps: list[dict]) -> str:
    """Which steps redrive number `raw` superseded, from the superseded history."""
    n = _int("redrive", raw, 1, 2**31 - 1, [])
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
    stored = await request.app.state.store.shared_settings()
    row = stored.get("max_unacknowledged_deliveries")
    if row is None:
        return request.app.state.settings.max_unacknowledged_deliveries
    return int(row["value"])


def _back(execution_id: str, done: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/executions/{_pathseg(execution_id)}?done={done}",
                            status_code=303)


@router.get("/executions/{execution_id}/cancel")
async def cancel_page(request: Request, execution_id: str) -> Response:
    session = await _session(request, need="operate")
    row, live = await _record(request, execution_id, session)
    if row["status"] in TERMINAL_STATUSES:
        raise UIError(409, "EXECUTION_TERMINAL",
                      f"execution {execution_id!r} already ended ({row['status']}); "
                      "nothing to cancel", session=session)
    return _render(request, "confirm_cancel.html", {
        "r": row, "now": row["read_at"],
        "blocked": views.explain_blocked(blocked_by(row, live), row),
        "held": row["status"] == "running", "by": _actor(session),
    }, session=session)


@router.post("/executions/{execution_id}/cancel")
async def cancel(request: Request, execution_id: str) -> Response:
    session, _ = await _checked_post(request)
    _check_id(execution_id, session)
    answer, status = await request.app.state.store.request_cancel(execution_id, _actor(session))
    operator_action("cancel", by=_actor(session), result=answer, execution_id=execution_id)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "terminal":
        raise UIError(409, "EXECUTION_TERMINAL",
                      f"execution {execution_id!r} already ended ({status}); nothing to cancel",
                      session=session)
    return _back(execution_id, "cancelled" if answer == "cancelled" else "cancel-requested")


@router.post("/executions/{execution_id}/wake")
async def wake(request: Request, execution_id: str) -> Response:
    session, _ = await _checked_post(request)
    _check_id(execution_id, session)
    answer = await request.app.state.store.request_wake(execution_id)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    return _back(execution_id, "woken" if answer == "requested" else "wake-ignored")


@router.post("/executions/{execution_id}/resume")
async def resume(request: Request, execution_id: str) -> Response:
    session, _ = await _checked_post(request)
    _check_id(execution_id, session)
    answer, status = await request.app.state.store.resume(execution_id, _actor(session))
    operator_action("resume", by=_actor(session), result=answer, execution_id=execution_id)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "not_parked":
        raise UIError(409, "EXECUTION_NOT_PARKED",
                      f"execution {execution_id!r} is {status}, not parked as poison; an "
                      "outcome-unknown step is settled by resolving it", session=session)
    return _back(execution_id, "resumed")


@dataclass
class Resolution:
    step: str
    action: str
    result_text: str
    error_name: str
    error_message: str
    result: Any = None
    problems: list[str] = field(default_factory=list)


def _resolution(form: dict[str, str], settings) -> Resolution:
    res = Resolution(
        step=form.get("step", ""), action=form.get("action", ""),
        result_text=form.get("result", ""), error_name=form.get("errorName", "").strip(),
        error_message=form.get("errorMessage", ""),
    )
    p = res.problems
    if res.action not in ("retry", "succeed", "fail"):
        p.append("choose how the step ended: retry, succeed or fail")
    if res.action == "succeed":
        if not res.result_text.strip():
            p.append("result: give the step's result as JSON (null, a number, \"text\", {...})")
        else:
            try:
                res.result = parse_json(res.result_text.encode(), max_depth=settings.max_json_depth)
            except BodyError as exc:
                p.append(f"result: {exc.message}")
    if _UNSTORABLE_TEXT.search(res.error_name + res.error_message):
        p.append("error: the name and message cannot hold NUL characters")
    if res.action == "fail":
        if not 1 <= len(res.error_name) <= 200:
            p.append("error name: 1 to 200 characters (for example PaymentDeclined)")
        if len(res.error_message) > 10000:
            p.append("error message: at most 10000 characters")
    return res


# ------------------------------------------- redrive, fork, terminate (one execution)

REDRIVE_MAX_SECONDS = 10 * 365 * 86400
_EXECUTION_ID = re.compile(EXECUTION_ID_PATTERN)


def _not_ended(execution_id: str, status: str, session: Session) -> UIError:
    return UIError(409, "EXECUTION_NOT_ENDED",
                   f"execution {execution_id!r} is {status}; only a failed, timed_out, cancelled "
                   "or completed execution can be redriven (cancel it first, or wait for it to "
                   "end)", session=session)


def _step_not_found(execution_id: str, step: str, session: Session) -> UIError:
    return UIError(404, "STEP_NOT_FOUND",
                   f"execution {execution_id!r} has no recorded step {step[:200]!r}; choose one "
                   "of the steps its page lists", session=session)


async def _recorded_steps(request: Request, execution_id: str) -> list[dict]:
    """The steps in the record (not effects in doubt, not superseded ones), in
    recorded order: the choices for fromStep."""
    rows = await request.app.state.store.execution_steps_page(
        execution_id, include_values=False, limit=STEPS_SHOWN + 1) or []
    return [s for s in rows if s["grp"] == 0]


def _text_field(name: str, value: str, limit: int, problems: list[str]) -> str | None:
    value = value.strip()
    if _UNSTORABLE_TEXT.search(value):
        problems.append(f"{name}: cannot hold NUL characters")
    elif len(value) > limit:
        problems.append(f"{name}: at most {limit} characters")
    return value or None


def _step_field(value: str, problems: list[str]) -> str | None:
    value = value.strip()
    if value and not ID_RE.fullmatch(value):
        problems.append("fromStep: a recorded step's key (1 to 200 characters from "
                        "A-Z a-z 0-9 . _ : -)")
        return None
    return value or None


@router.get("/executions/{execution_id}/redrive")
async def redrive_page(request: Request, execution_id: str) -> Response:
    session = await _session(request, need="operate")
    row, _ = await _record(request, execution_id, session)
    if row["status"] not in REDRIVABLE:
        raise _not_ended(execution_id, row["status"], session)
    return _render(request, "confirm_redrive.html", {
        "r": row, "now": row["read_at"], "by": _actor(session),
        "steps": await _recorded_steps(request, execution_id), "problems": [],
    }, session=session)


@router.post("/executions/{execution_id}/redrive")
async def redrive(request: Request, execution_id: str) -> Response:
    session, form = await _checked_post(request)
    _check_id(execution_id, session)
    problems: list[str] = []
    from_step = _step_field(form.get("fromStep", ""), problems)
    reason = _text_field("reason", form.get("reason", ""), 2000, problems)
    timeout = None
    if raw := form.get("timeoutSeconds", "").strip():
        timeout = _int("timeoutSeconds", raw, 1, REDRIVE_MAX_SECONDS, problems)
    if problems:
        row, _ = await _record(request, execution_id, session)
        return _render(request, "confirm_redrive.html", {
            "r": row, "now": row["read_at"], "by": _actor(session),
            "steps": await _recorded_steps(request, execution_id), "problems": problems,
        }, session=session, status=422)
    answer, detail = await request.app.state.store.redrive(
        execution_id, _actor(session), from_step=from_step, timeout_seconds=timeout,
        reason=reason)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "not_ended":
        raise _not_ended(execution_id, detail, session)
    if answer == "completed":
        raise UIError(409, "REDRIVE_NEEDS_FROM_STEP",
                      f"execution {execution_id!r} completed; choose the step to run it again "
                      "from (that step and every step recorded after it run again)",
                      session=session)
    if answer == "step_not_found":
        raise _step_not_found(execution_id, from_step or "", session)
    return RedirectResponse(f"/ui/executions/{_pathseg(execution_id)}?done=redriven"
                            f"&redrive={detail.redrive}", status_code=303)


@dataclass
class ForkForm:
    from_step: str = ""
    new_id: str = ""
    params_text: str = ""
    params: Any = None
    problems: list[str] = field(default_factory=list)


def _fork_form(form: dict[str, str], request: Request, row: dict) -> ForkForm:
    f = ForkForm(from_step=form.get("fromStep", "").strip(),
                 new_id=form.get("executionId", "").strip(), params_text=form.get("params", ""))
    p = f.problems
    if not f.from_step:
        p.append("fromStep: choose the step to run again from")
    else:
        _step_field(f.from_step, p)
    if f.new_id:
        try:
            check_client_execution_id(f.new_id)
        except ApiError as exc:
            p.append(f"{exc.code}: {exc.message}")
        else:
            if not ID_RE.fullmatch(f.new_id):
                p.append("executionId: 1 to 200 characters from A-Z a-z 0-9 . _ : - "
                         "(or leave it empty for a generated one)")
    if f.params_text.strip():
        try:
            f.params = parse_json(f.params_text.encode(),
                                  max_depth=request.app.state.settings.max_json_depth)
        except BodyError as exc:
            p.append(f"INVALID_PARAMS: params: {exc.message}; give JSON such as "
                     '{"amount": 100}, or leave it empty to keep the source\'s params')
    definition = (request.app.state.workflows or {}).get(row["workflow_id"])
    if definition is not None and not p:
        # New params are checked against the workflow's model, as the API does.
        try:
            registered_workflow(request, row["workflow_id"],
                                f.params if f.params is not None else row["params"])
        except ApiError as exc:
            p.append(f"{exc.code}: {exc.message}")
    return f


async def _fork_page(request: Request, row: dict, session: Session, f: ForkForm,
                     status: int = 200) -> Response:
    steps = await _recorded_steps(request, row["execution_id"])
    if not steps:
        raise UIError(409, "NO_RECORDED_STEP",
                      f"execution {row['execution_id']!r} has no recorded step to fork from; "
                      "admit a new execution instead", session=session)
    return _render(request, "confirm_fork.html", {
        "r": row, "now": row["read_at"], "by": _actor(session), "steps": steps, "f": f,
    }, session=session, status=status)


@router.get("/executions/{execution_id}/fork")
async def fork_page(request: Request, execution_id: str) -> Response:
    session = await _session(request, need="operate")
    row, _ = await _record(request, execution_id, session)
    return await _fork_page(request, row, session, ForkForm())


@router.post("/executions/{execution_id}/fork")
async def fork(request: Request, execution_id: str) -> Response:
    session, form = await _checked_post(request)
    row, _ = await _record(request, execution_id, session)
    f = _fork_form(form, request, row)
    if f.problems:
        return await _fork_page(request, row, session, f, status=422)
    definition = (request.app.state.workflows or {}).get(row["workflow_id"])
    new_id = f.new_id or fork_id(execution_id)
    try:
        answer, detail = await request.app.state.store.fork(
            execution_id, _actor(session), from_step=f.from_step, new_id=new_id,
            params=f.params, admitted_by=session.principal.token_id,
            timeout_seconds=definition.timeout_seconds if definition is not None else None)
    except InvalidEvent as exc:
        f.problems.append(f"INVALID_EXECUTION_EVENT: params cannot be stored exactly ({exc}); "
                          "give plain JSON values")
        return await _fork_page(request, row, session, f, status=422)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "step_not_found":
        raise _step_not_found(execution_id, f.from_step, session)
    if answer == "conflict":
        raise UIError(409, "EXECUTION_ID_CONFLICT",
                      f"execution ID {new_id!r} is taken ({detail['status']}); fork under "
                      "another ID, or leave it empty for a generated one", session=session)
    return RedirectResponse(f"/ui/executions/{_pathseg(detail.execution_id)}?done=forked",
                            status_code=303)


@router.get("/executions/{execution_id}/terminate")
async def terminate_page(request: Request, execution_id: str) -> Response:
    session = await _session(request, need="operate")
    row, live = await _record(request, execution_id, session)
    if row["status"] in TERMINAL_STATUSES:
        raise UIError(409, "EXECUTION_TERMINAL",
                      f"execution {execution_id!r} already ended ({row['status']}); "
                      "nothing to terminate", session=session)
    return _render(request, "confirm_terminate.html", {
        "r": row, "now": row["read_at"], "by": _actor(session),
        "blocked": views.explain_blocked(blocked_by(row, live), row),
    }, session=session)


@router.post("/executions/{execution_id}/terminate")
async def terminate(request: Request, execution_id: str) -> Response:
    session, _ = await _checked_post(request)
    _check_id(execution_id, session)
    answer, status = await request.app.state.store.terminate(execution_id, _actor(session))
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "terminal":
        raise UIError(409, "EXECUTION_TERMINAL",
                      f"execution {execution_id!r} already ended ({status}); nothing to "
                      "terminate", session=session)
    return _back(execution_id, "terminated")


@router.get("/executions/{execution_id}/{action}")
async def action_by_get(request: Request, execution_id: str, action: str) -> Response:
    """Actions are POSTs; a bookmarked or reloaded action URL shows the execution."""
    if action not in ("wake", "resume", "resolve"):
        raise UIError(404, "NOT_FOUND", "no such page; the dashboard starts at /ui")
    return RedirectResponse(f"/ui/executions/{_pathseg(execution_id)}", status_code=303)


@router.post("/executions/{execution_id}/resolve")
async def resolve(request: Request, execution_id: str) -> Response:
    """Without confirm=yes: the review page saying what will happen. With it:
    settle the step and go back to the execution."""
    session, form = await _checked_post(request)
    row, live = await _record(request, execution_id, session)
    res = _resolution(form, request.app.state.settings)
    if _UNSTORABLE_TEXT.search(res.step):
        res.problems.append("step: not a step of this execution")
    effect = None
    if not res.problems:
        effects = await request.app.state.store.outcome_unknown_effects(execution_id)
        effect = next((e for e in effects if e["step_key"] == res.step), None)
        if effect is None or row["status"] != "parked":
            raise UIError(
                409, "STEP_NOT_OUTCOME_UNKNOWN",
                f"step {res.step!r} of {execution_id!r} is not waiting for a decision (the "
                f"execution is {row['status']})", session=session)
    if res.problems or form.get("confirm") != "yes":
        return _render(request, "confirm_resolve.html", {
            "r": row, "res": res, "effect": effect, "now": row["read_at"],
            "by": _actor(session), "workers_live": row["workflow_id"] in live,
        }, session=session, status=422 if res.problems else 200)
    try:
        answer, status = await request.app.state.store.resolve_step(
            execution_id, res.step, res.action, by=_actor(session), result=res.result,
            error=({"name": res.error_name, "message": res.error_message}
                   if res.action == "fail" else None),
        )
    except InvalidEvent as exc:
        raise UIError(422, "INVALID_RESOLUTION",
                      f"the result cannot be stored exactly ({exc}); give plain JSON",
                      session=session) from None
    operator_action(f"resolve {res.action}", by=_actor(session), result=answer,
                    execution_id=execution_id, step_key=res.step)
    if answer == "not_found":
        raise _not_found(execution_id, session)
    if answer == "step_not_found":
        raise UIError(404, "STEP_NOT_FOUND",
                      f"execution {execution_id!r} has no step {res.step!r}", session=session)
    if answer == "not_outcome_unknown":
        raise UIError(409, "STEP_NOT_OUTCOME_UNKNOWN",
                      f"step {res.step!r} of {execution_id!r} is not waiting for a decision "
                      f"(the execution is {status})", session=session)
    return _back(execution_id, "resolved")


# ------------------------------------------------------- bulk operations

OPERATION_ID = re.compile(r"op-[0-9a-f]{16}")
MAX_EXECUTION_IDS = 10_000
ACTION_WORDS = {
    "cancel": "cancel each one (as the Cancel button does)",
    "redrive": "redrive each one in place (failed, timed out or cancelled ones)",
    "resume": "resume each one parked as poison",
    "resolve": "resolve each one's parked step with retry: call it again with the same "
               "idempotency key",
}
assert set(ACTION_WORDS) == set(BULK_ACTIONS)


@dataclass
class BulkForm:
    raw: dict[str, str] = field(default_factory=dict)
    action: str = "cancel"
    spec: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    problems: list[str] = field(default_factory=list)


BULK_FIELDS = ("action", "workflowId", "status", "admittedFrom", "admittedTo",
               "minUnacknowledgedDeliveries", "executionIds", "reason", "fromStep",
               "timeoutSeconds")


def _bulk_form(form: dict[str, str]) -> BulkForm:
    """The action, its filter (the API's shape) and options, or problems."""
    raw = {k: form.get(k, "").strip() for k in BULK_FIELDS}
    b = BulkForm(raw=raw, action=raw["action"])
    p = b.problems
    if b.action not in BULK_ACTIONS:
        p.append(f"action: one of {', '.join(BULK_ACTIONS)}")
    if v := raw["workflowId"]:
        if ID_RE.fullmatch(v):
            b.spec["workflowId"] = v
        else:
            p.append("workflow: 1 to 200 characters from A-Z a-z 0-9 . _ : -")
    if v := raw["status"]:
        if v in STATUSES:
            b.spec["status"] = v
        else:
            p.append(f"status: one of {', '.join(STATUSES)}")
    for name in ("admittedFrom", "admittedTo"):
        if (v := raw[name]) and (at := _parse_time(name, v, p)) is not None:
            b.spec[name] = at.isoformat()
    if v := raw["minUnacknowledgedDeliveries"]:
        if (n := _int("minUnacknowledgedDeliveries", v, 0, 2**31 - 1, p)) is not None:
            b.spec["minUnacknowledgedDeliveries"] = n
    if v := raw["executionIds"]:
        ids = list(dict.fromkeys(re.split(r"[\s,]+", v.strip())))
        bad = [i for i in ids if not _EXECUTION_ID.fullmatch(i)]
        if bad:
            p.append(f"execution IDs: {bad[0][:100]!r} is not an execution ID")
        elif len(ids) > MAX_EXECUTION_IDS:
            p.append(f"execution IDs: at most {MAX_EXECUTION_IDS}; start several operations")
        else:
            b.spec["executionIds"] = ids
            raw["executionIds"] = " ".join(ids)
    if not b.spec and not p:
        p.append("filter: give at least one condition (workflow, status, admitted from / to, "
                 "unacknowledged deliveries, or execution IDs)")
    b.reason = _text_field("reason", raw["reason"], 2000, p)
    if b.action == "redrive":
        if step := _step_field(raw["fromStep"], p):
            b.options["fromStep"] = step
        if v := raw["timeoutSeconds"]:
            if (n := _int("timeoutSeconds", v, 1, REDRIVE_MAX_SECONDS, p)) is not None:
                b.options["timeoutSeconds"] = n
    if b.action == "resolve":
        b.options = {"resolution": {"action": "retry", "result": None, "error": None}}
    return b


async def _bulk_page(request: Request, session: Session, b: BulkForm, *,
                     counted: tuple[int, list[str]] | None = None, status: int = 200) -> Response:
    store = request.app.state.store
    live = await _live(request)
    return _render(request, "operations.html", {
        "b": b, "counted": counted, "actions": ACTION_WORDS,
        "workflow_ids": sorted(set(await store.workflow_ids_seen()) | live
                               | set(request.app.state.workflows or {})),
        "limit": request.app.state.settings.max_operation_executions,
    }, session=session, status=status)


@router.get("/operations")
async def operations_page(request: Request) -> Response:
    session = await _session(request, need="operate")
    return await _bulk_page(request, session, BulkForm())


@router.post("/operations")
async def operations_post(request: Request) -> Response:
    """do=count: the dry run (how many, a sample), nothing acted on; do=start:
    create the operation (the items are what the filter matches now)."""
    session, form = await _checked_post(request)
    b = _bulk_form(form)
    if b.problems:
        return await _bulk_page(request, session, b, status=422)
    store = request.app.state.store
    if form.get("do") != "start":
        return await _bulk_page(request, session, b,
                                counted=await store.preview_operation(b.spec))
    limit = request.app.state.settings.max_operation_executions
    record = await store.create_operation(b.action, b.spec, by=_actor(session),
                                          options=b.options, reason=b.reason, max_matched=limit)
    if record is None:
        raise UIError(422, "TOO_MANY_MATCHED",
                      f"the filter matches more than {limit} executions "
                      "(FENCEPOST_MAX_OPERATION_EXECUTIONS); narrow it (e.g. admitted from / "
                      "to) and start several operations", session=session)
    return RedirectResponse(f"/ui/operations/{record['operation_id']}", status_code=303)


async def _operation(request: Request, operation_id: str, session: Session) -> dict:
    record = None
    if OPERATION_ID.fullmatch(operation_id):
        record = await request.app.state.store.get_operation(operation_id)
    if record is None:
        raise UIError(404, "OPERATION_NOT_FOUND",
                      f"no operation {operation_id[:100]!r}; start one at /ui/operations",
                      session=session)
    return record


@router.get("/operations/{operation_id}")
async def operation_page(request: Request, operation_id: str) -> Response:
    session = await _session(request, need="operate")
    op = await _operation(request, operation_id, session)
    return _render(request, "operation.html", {
        "op": op, "now": await request.app.state.store.db_now(), "actions": ACTION_WORDS,
        "refresh": 2 if op["status"] == "running" else None,
        "notice": "Stopped: what was done stays done; the rest is not acted on."
        if request.query_params.get("done") == "stopped" else None,
    }, session=session)


@router.post("/operations/{operation_id}/cancel")
async def operation_cancel(request: Request, operation_id: str) -> Response:
    session, _ = await _checked_post(request)
    await _operation(request, operation_id, session)
    answer, record = await request.app.state.store.cancel_operation(operation_id,
                                                                    _actor(session))
    if answer == "finished":
        raise UIError(409, "OPERATION_FINISHED",
                      f"operation {operation_id!r} already {record['status']}; nothing to stop",
                      session=session)
    return RedirectResponse(f"/ui/operations/{operation_id}?done=stopped", status_code=303)


@router.get("/operations/{operation_id}/cancel")
async def operation_cancel_by_get(operation_id: str) -> Response:
    """A reloaded Stop URL shows the operation."""
    return RedirectResponse(f"/ui/operations/{_pathseg(operation_id)}", status_code=303)


# ----------------------------------------------------------------- workers


@router.get("/workers")
async def workers_page(request: Request) -> Response:
    session = await _session(request)
    store = request.app.state.store
    settings = request.app.state.settings
    stale = 3 * settings.renew_seconds + 1
    workers = await store.list_workers(stale_after_seconds=stale)
    leases = await store.leases_by_owner()
    now = await store.db_now()
    return _render(request, "workers.html", {
        "workers": workers, "leases": leases, "now": now, "stale": stale,
        "alive": sum(1 for w in workers if w["alive"]),
    }, session=session)


# --------------------------------------------------------------- fallback


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_found_page(request: Request, rest: str) -> Response:
    if rest == "" and request.method == "GET":
        return RedirectResponse("/ui", status_code=307)
    raise UIError(404, "NOT_FOUND", "no such page; the dashboard starts at /ui")
