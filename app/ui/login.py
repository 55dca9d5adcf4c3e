"""Signing in with an API token and out again: the session cookie holds a
session ID, never the token."""

from __future__ import annotations

import re
import secrets

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.api.limits import LOOPBACK_HOSTS, host_name
from app.commands.errors import UNSTORABLE_TEXT
from app.ui.errors import UIError
from app.ui.render import UIRoute, render
from app.ui.session import (
    LEGACY_TOKEN_COOKIE,
    SESSION_COOKIE,
    SESSION_ID,
    read_form,
    same_origin,
    secure_cookies,
    session_digest,
)

router = APIRouter(route_class=UIRoute)


def _cookie_will_be_dropped(request: Request) -> bool:
    """A Secure cookie sent over plain HTTP to a name other than loopback:
    the browser will not keep it, so signing in would only loop."""
    return (secure_cookies(request) and request.url.scheme != "https"
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
    if UNSTORABLE_TEXT.search(value) or any(ord(c) < 32 for c in value):
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
    return render(request, "login.html", {
        "next": _safe_next(request.query_params.get("next")),
        "notice": LOGIN_REASONS.get(request.query_params.get("reason", "")),
        "error": None, "insecure": INSECURE_NOTICE if _cookie_will_be_dropped(request) else None,
    }, session=None)


@router.post("/login")
async def login(request: Request) -> Response:
    if request.app.state.settings.auth == "disabled":
        return RedirectResponse("/ui", status_code=303)
    if not same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST", "sign in from the dashboard's own login page")
    form = await read_form(request)
    next_url = _safe_next(form.get("next"))
    token = form.get("token", "").strip()
    if token.lower().startswith("bearer "):
        token = token[7:].strip()
    principal = None
    if token and len(token) <= 500 and re.fullmatch(r"[A-Za-z0-9_-]+", token):
        principal = await request.app.state.verifier.verify(token)
    insecure = INSECURE_NOTICE if _cookie_will_be_dropped(request) else None
    if principal is not None and not principal.may("read", "operate"):
        return render(request, "login.html", {
            "next": next_url, "notice": None, "insecure": insecure,
            "error": ("FORBIDDEN", f"token {principal.name!r} has role "
                      f"{', '.join(sorted(principal.roles))}; the dashboard needs read or operate"),
        }, session=None, status=403)
    settings = request.app.state.settings
    session_id = secrets.token_urlsafe(32)
    if principal is None or not await request.app.state.store.sessions.create_ui_session(
            session_digest(session_id), principal.token_id, settings.session_seconds):
        return render(request, "login.html", {
            "next": next_url, "notice": None, "insecure": insecure,
            "error": ("UNAUTHENTICATED", "the API token is unknown or revoked; create one with "
                      "`fencepost tokens create --role read --name NAME`"),
        }, session=None, status=401)
    response = RedirectResponse(next_url, status_code=303)
    # The cookie holds the session ID, never the token.
    response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict",
                        path="/ui", secure=secure_cookies(request),
                        max_age=max(1, int(settings.session_seconds)))
    if LEGACY_TOKEN_COOKIE in request.cookies:
        response.delete_cookie(LEGACY_TOKEN_COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not same_origin(request):
        raise UIError(403, "CROSS_SITE_REQUEST", "sign out from the dashboard itself")
    session_id = request.cookies.get(SESSION_COOKIE, "")
    if request.app.state.settings.auth != "disabled" and SESSION_ID.fullmatch(session_id):
        await request.app.state.store.sessions.end_ui_session(session_digest(session_id))
    response = RedirectResponse("/ui/login?reason=signed-out", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/ui", httponly=True, samesite="strict",
                           secure=secure_cookies(request))
    return response
