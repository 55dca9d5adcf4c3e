"""Dashboard sessions (issue 11, item 6).

Attack: the dashboard's cookie held the raw API token, so anything that could
read the cookie (a shared machine's browser profile, a proxy log, a backup)
held a bearer token for the whole API. Now the cookie is a server-side
session: a random 256-bit ID, only its SHA-256 stored (ui_sessions), expiring
after FENCEPOST_SESSION_SECONDS, ended at sign-out and as soon as its token is
revoked; the cookie is HttpOnly, SameSite=Strict, Path=/ui and Secure unless
FENCEPOST_COOKIE_SECURE=false (`fencepost dev`).
"""

from __future__ import annotations

import hashlib
from http.cookies import SimpleCookie

import httpx
import pytest

from app.ui.routes import SESSION_COOKIE
from tests.tenancy.conftest import headers

FORM = {"content-type": "application/x-www-form-urlencoded"}


async def login(api: httpx.AsyncClient, token: str) -> httpx.Response:
    r = await api.post("/ui/login", data={"token": token, "next": "/ui"}, headers=FORM)
    assert r.status_code == 303, r.text
    return r


def session_cookie(response: httpx.Response):
    """The session cookie's morsel from Set-Cookie (read here, not by httpx's jar,
    which keeps a Secure cookie away from http://)."""
    for header in response.headers.get_list("set-cookie"):
        jar = SimpleCookie()
        jar.load(header)
        if SESSION_COOKIE in jar:
            return jar[SESSION_COOKIE]
    raise AssertionError(f"no {SESSION_COOKIE} cookie in {response.headers.get_list('set-cookie')}")


def with_cookie(value: str) -> dict[str, str]:
    return {"cookie": f"{SESSION_COOKIE}={value}"}


async def test_the_dashboard_cookie_is_not_a_usable_api_token(api, tokens):
    r = await login(api, tokens.operate.token)
    cookie = session_cookie(r).value
    assert tokens.operate.token not in r.headers.get("set-cookie", "")
    assert cookie != tokens.operate.token
    # The attack: what the browser keeps, replayed as a bearer token.
    attack = await api.get("/v1/executions", headers=headers(cookie))
    assert attack.status_code == 401, attack.text
    assert attack.json()["error"]["code"] == "UNAUTHENTICATED"
    # The cookie itself works where it belongs: the dashboard.
    page = await api.get("/ui", headers=with_cookie(cookie))
    assert page.status_code == 200, page.text
    assert "ops" in page.text


async def test_only_a_digest_of_the_random_session_id_is_stored(api, tokens, pool):
    r = await login(api, tokens.operate.token)
    cookie = session_cookie(r).value
    assert len(cookie) >= 43  # 256 random bits, URL-safe base64
    rows = await pool.fetch("SELECT session_sha256, token_id, created_at, expires_at, ended_at "
                            "FROM ui_sessions")
    assert len(rows) == 1
    (row,) = rows
    assert row["session_sha256"] == hashlib.sha256(cookie.encode()).hexdigest()
    assert row["token_id"] == tokens.operate.token_id and row["ended_at"] is None
    lifetime = (row["expires_at"] - row["created_at"]).total_seconds()
    assert lifetime == pytest.approx(api.app.state.settings.session_seconds, abs=2)
    assert cookie not in repr([dict(r) for r in rows])
    # Two sign-ins: two different sessions.
    again = session_cookie(await login(api, tokens.operate.token)).value
    assert again != cookie


async def test_the_cookie_is_secure_httponly_and_strict_by_default(make_api, tenancy_settings,
                                                                   tokens):
    assert tenancy_settings.cookie_secure is True
    api = await make_api()
    morsel = session_cookie(await login(api, tokens.read.token))
    assert morsel["secure"] and morsel["httponly"]
    assert morsel["samesite"].lower() == "strict" and morsel["path"] == "/ui"
    plain = await make_api(tenancy_settings.model_copy(update={"cookie_secure": False}))
    morsel = session_cookie(await login(plain, tokens.read.token))
    assert not morsel["secure"] and morsel["httponly"]


async def test_an_expired_session_goes_back_to_the_login_page(api, tokens, pool):
    cookie = session_cookie(await login(api, tokens.read.token)).value
    assert (await api.get("/ui/workers", headers=with_cookie(cookie))).status_code == 200
    await pool.execute("UPDATE ui_sessions SET expires_at = now() - interval '1 second'")
    r = await api.get("/ui/workers", headers=with_cookie(cookie))
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=%2Fui%2Fworkers&reason=expired"


async def test_sign_out_ends_the_session_on_the_server(api, tokens, pool):
    cookie = session_cookie(await login(api, tokens.operate.token)).value
    r = await api.post("/ui/logout", headers=with_cookie(cookie))
    assert r.status_code == 303
    cleared = session_cookie(r)
    assert cleared.value == "" and cleared["max-age"] == "0"
    ended = await pool.fetchval("SELECT ended_at FROM ui_sessions WHERE session_sha256 = $1",
                                hashlib.sha256(cookie.encode()).hexdigest())
    assert ended is not None
    # A copy of the cookie kept from before the sign-out no longer opens anything.
    r = await api.get("/ui", headers=with_cookie(cookie))
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


async def test_revoking_the_token_ends_its_sessions_at_once(api, tokens, store):
    cookie = session_cookie(await login(api, tokens.operate.token)).value
    other = session_cookie(await login(api, tokens.read.token)).value
    assert (await api.get("/ui", headers=with_cookie(cookie))).status_code == 200
    assert await store.tokens.revoke_token(tokens.operate.token_id) == 1
    # Not after a cache expires: the next page.
    r = await api.get("/ui", headers=with_cookie(cookie))
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=%2Fui&reason=revoked"
    # Another token's session is untouched.
    assert (await api.get("/ui", headers=with_cookie(other))).status_code == 200


@pytest.mark.parametrize("value", ["", "x", "fp_abc_def", "a" * 43, "é" * 50, "a" * 5000, "\x01"])
async def test_an_unknown_or_malformed_session_cookie_is_sent_to_sign_in(api, tokens, value):
    r = await api.get("/ui", headers={"cookie": f"{SESSION_COOKIE}={value}".encode("latin-1")})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


async def test_the_old_token_cookie_opens_nothing(api, tokens):
    r = await api.get("/ui", headers={"cookie": f"fencepost_ui_token={tokens.operate.token}"})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
