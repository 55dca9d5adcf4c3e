"""Who is looking: the session behind the cookie, and the checks every
acting POST passes (same origin, role operate, the form's CSRF field).

Signing in with an API token opens a server-side session: the browser keeps
only a random 256-bit session ID (HttpOnly, SameSite=Strict, Path=/ui,
Secure unless FENCEPOST_COOKIE_SECURE=false), the server only its SHA-256
(ui_sessions). Every page reads the session in one statement with its
token: it works until it expires (FENCEPOST_SESSION_SECONDS), is signed out,
or its token is revoked, whichever comes first; the cookie is never usable
as an API token. POSTs are checked against cross-site requests twice:
Origin/Sec-Fetch-Site, and a form field derived (HMAC) from the session ID.
With FENCEPOST_AUTH=disabled there is no login; the form field is then
derived from a random cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request

from app.api.auth import ANONYMOUS, Principal, principal_of
from app.api.json_body import read_body
from app.ui.errors import LoginRequired, UIError

SESSION_COOKIE = "fencepost_ui_session"
LEGACY_TOKEN_COOKIE = "fencepost_ui_token"  # held the raw token before sessions: cleared at sign-in
CSRF_COOKIE = "fencepost_ui_csrf"
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32): 256 bits


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

    @property
    def actor(self) -> str:
        """Who acts, as recorded in the history."""
        return self.principal.name


def csrf_of(seed: str) -> str:
    return hmac.new(seed.encode(), b"fencepost-ui-csrf", hashlib.sha256).hexdigest()


def session_digest(session_id: str) -> str:
    """What ui_sessions stores of a session ID: its SHA-256 (the ID is 256
    random bits, so a fast hash is enough)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def secure_cookies(request: Request) -> bool:
    return request.app.state.settings.cookie_secure


def _here(request: Request) -> str:
    path = request.url.path
    return path + ("?" + request.url.query if request.url.query else "")


async def viewer(request: Request, *, need: str = "read") -> Session:
    """The viewer, or LoginRequired / UIError(403). A refusal later in the
    request is shown to this viewer."""
    if request.app.state.settings.auth == "disabled":
        seed = request.cookies.get(CSRF_COOKIE, "")
        new_seed = None
        if not re.fullmatch(r"[A-Za-z0-9_-]{32,64}", seed):
            seed = new_seed = secrets.token_urlsafe(32)
        session = Session(ANONYMOUS, False, csrf_of(seed), new_seed)
    else:
        session_id = request.cookies.get(SESSION_COOKIE, "")
        next_url = _here(request) if request.method == "GET" else "/ui"
        if not session_id:
            raise LoginRequired(next_url)
        if not SESSION_ID.fullmatch(session_id):  # not one we issued: no query
            raise LoginRequired(next_url, "unknown")
        state, row = await request.app.state.store.sessions.find_ui_session(session_digest(session_id))
        if row is None:
            raise LoginRequired(next_url, state)
        session = Session(principal_of(row), True, csrf_of(session_id))
    principal = session.principal
    if not principal.may("read", "operate"):
        raise UIError(403, "FORBIDDEN",
                      f"the dashboard needs a token with role read or operate; token "
                      f"{principal.name!r} has {', '.join(sorted(principal.roles))}")
    if need == "operate" and not principal.may("operate"):
        raise UIError(403, "FORBIDDEN",
                      f"this needs a token with role operate; token {principal.name!r} has "
                      f"{', '.join(sorted(principal.roles))}", session=session)
    request.state.ui_session = session
    return session


def same_origin(request: Request) -> bool:
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True  # older clients: the form token still has to match
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def read_form(request: Request) -> dict[str, str]:
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


async def checked_post(request: Request) -> tuple[Session, dict[str, str]]:
    """An operate session and its form, refused when it comes from another site."""
    if not same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST",
                      "this form was sent from another site; open the dashboard and try again")
    session = await viewer(request, need="operate")
    form = await read_form(request)
    if not hmac.compare_digest(form.get("csrf", ""), session.csrf):
        raise UIError(403, "CSRF_TOKEN_MISMATCH",
                      "the form is out of date (or was not sent from the dashboard); "
                      "reload the page and try again", session=session)
    return session, form
