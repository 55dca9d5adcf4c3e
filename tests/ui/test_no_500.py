"""Whatever is asked of /ui, the answer is a page (never a 500, never a JSON
error), with the security headers, and no page points at another origin.
Plain HTTP against the served app, with and without authentication."""

from __future__ import annotations

import re

import httpx
import pytest

from app.ui.routes import SESSION_COOKIE
from tests.support.admission import admit
from tests.ui.helpers import sign_in

ODD_GETS = [
    "/ui", "/ui/", "/ui/workers", "/ui/login", "/ui/nope", "/ui/executions",
    "/ui/executions/no-such", "/ui/executions/%00", "/ui/executions/%ED%A0%80",
    "/ui/executions/" + "a" * 5000, "/ui/executions/x/cancel", "/ui/executions/x/wake",
    "/ui/executions/x/nope", "/ui/static/ui.css", "/ui/static/..%2F..%2Fapp.py",
    "/ui/static/nope.js", "/ui?status=%00", "/ui?workflowId=%00", "/ui?workflowId=a%20b",
    "/ui?minUnacknowledgedDeliveries=99999999999999999999", "/ui?minUnacknowledgedDeliveries=x",
    "/ui?admittedFrom=99999-01-01", "/ui?admittedFrom=0001-01-01T00:00",
    "/ui?admittedTo=9999-12-31T23:59%2B14:00", "/ui?admittedFrom=2026-01-01T00:00-23:59",
    "/ui?page=0", "/ui?page=999999999999", "/ui?page=10000", "/ui?limit=7", "/ui?sort=%27;--",
    "/ui?blockedBy=%3Cscript%3E", "/ui?refresh=1", "/ui?status=parked&status=failed",
    "/ui/executions/ok-1?eventsAfter=-1", "/ui/executions/ok-1?eventsAfter=99999999999999999999",
    "/ui/executions/ok-1?done=%3Cb%3E", "/ui/login?next=https://evil.example/",
    "/ui/login?next=//evil.example", "/ui/login?reason=%3Cscript%3E",
]

ODD_POSTS = [
    ("/ui/executions/ok-1/cancel", {"content-type": "application/x-www-form-urlencoded"}, b""),
    ("/ui/executions/ok-1/cancel", {"content-type": "application/json"}, b"{}"),
    ("/ui/executions/ok-1/wake", {"content-type": "application/x-www-form-urlencoded"},
     b"csrf=%FF%FE"),
    ("/ui/executions/ok-1/resolve", {"content-type": "application/x-www-form-urlencoded"},
     b"csrf=x&step=%00&action=succeed&result=%00"),
    ("/ui/executions/%00/resume", {"content-type": "application/x-www-form-urlencoded"}, b""),
    ("/ui/executions/ok-1/cancel", {"content-type": "application/x-www-form-urlencoded",
                                     "origin": "null"}, b""),
    ("/ui/login", {"content-type": "application/x-www-form-urlencoded"},
     b"token=fp_a_b%00&next=/ui"),
    ("/ui/login", {"content-type": "application/x-www-form-urlencoded"}, b"token=" + b"x" * 600),
    ("/ui/logout", {"content-type": "text/plain"}, b"?"),
    ("/ui/nope", {}, b""),
]

FOREIGN = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:[a-z]+:)?//""", re.I)


def _check_page(response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:300])
    if response.status_code in (303, 307):
        assert response.headers["location"].startswith("/ui"), (what, response.headers)
        return
    if what.startswith("GET /ui/static/ui.css"):
        return
    assert response.headers["content-type"].startswith("text/html"), (what, response.headers)
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert not FOREIGN.search(response.text), (what, FOREIGN.search(response.text))
    assert "<script" not in response.text.lower(), what


@pytest.mark.parametrize("auth", ["disabled", "enabled"])
async def test_no_request_to_ui_is_a_500(open_ui, auth):
    ui = await open_ui(auth=auth, worker=False)
    await admit(ui.store, "ui-sleep", params={}, execution_id="ok-1")
    cookies = {}
    if auth == "enabled":
        cookies[SESSION_COOKIE] = await sign_in(ui.base, await ui.token("operate", "fuzzer"))
    async with httpx.AsyncClient(base_url=ui.base, cookies=cookies, timeout=15) as client:
        for path in ODD_GETS:
            response = await client.get(path)
            _check_page(response, f"GET {path}")
        for path, headers, body in ODD_POSTS:
            response = await client.post(path, headers=headers, content=body)
            _check_page(response, f"POST {path}")
            assert response.status_code != 200 or path == "/ui/login", path
        for method in ("PUT", "DELETE", "PATCH"):
            response = await client.request(method, "/ui/executions/ok-1/cancel")
            _check_page(response, f"{method} cancel")
        # An open redirect is not possible through the login page.
        if auth == "enabled":
            page = (await client.get("/ui/login?next=https://evil.example/")).text
            assert 'value="/ui"' in page
    assert (await ui.store.history.get("ok-1"))["status"] == "admitted"


async def test_a_stale_or_unknown_cookie_goes_to_the_login_page(open_ui):
    ui = await open_ui(auth="enabled", worker=False)
    # The old cookie (it held an API token) opens nothing, even holding a real token.
    async with httpx.AsyncClient(base_url=ui.base, timeout=15, cookies={
            "fencepost_ui_token": await ui.token("operate", "old-cookie")}) as client:
        response = await client.get("/ui/workers")
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/login?next=%2Fui%2Fworkers"
    for stale in ("fp_abc_def", "A" * 43):
        async with httpx.AsyncClient(base_url=ui.base, timeout=15,
                                     cookies={SESSION_COOKIE: stale}) as client:
            response = await client.get("/ui/workers")
            assert response.status_code == 303
            assert response.headers["location"] == "/ui/login?next=%2Fui%2Fworkers&reason=unknown"
    async with httpx.AsyncClient(base_url=ui.base, timeout=15,
                                 cookies={SESSION_COOKIE: "fp_abc_def"}) as client:
        response = await client.post("/ui/executions/x/wake")
        assert response.status_code == 303
