"""Redrive, fork, terminate and bulk operations: roles with authentication
on, and odd input to every new page and form answered by a page (never a
500, never a JSON error), with the security headers."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.async_api import expect

from app.ui.routes import SESSION_COOKIE
from tests.support.admission import admit
from tests.support.waiting import wait_status
from tests.ui import flows
from tests.ui.helpers import UI_WAIT, sign_in
from tests.ui.test_no_500 import _check_page


async def test_read_role_sees_the_actions_disabled_and_operate_acts(open_ui):
    ui = await open_ui(auth="enabled")
    flows.FIXED.clear()
    eid = await admit(ui.store, "ui-ship", params={}, execution_id="ship-auth")
    await wait_status(ui.store, eid, "failed", timeout=UI_WAIT)
    reader = await sign_in(ui.base, await ui.token("read", "reader-rita"))
    operator = await sign_in(ui.base, await ui.token("operate", "ops-omar"))
    host = re.sub(r"^http://|:\d+$", "", ui.base)

    page = await ui.page()
    await page.context.add_cookies([{"name": SESSION_COOKIE, "value": reader, "domain": host,
                                     "path": "/ui"}])
    await page.goto(f"/ui/executions/{eid}")
    await expect(page.locator("#redrive")).to_be_disabled()
    await expect(page.locator("#fork")).to_be_disabled()
    for path in (f"/ui/executions/{eid}/redrive", f"/ui/executions/{eid}/fork",
                 "/ui/operations", "/ui/operations/op-0000000000000000"):
        response = await page.goto(path)
        assert response.status == 403, path
        await expect(page.locator("h1")).to_contain_text("FORBIDDEN")

    page2 = await ui.page()
    await page2.context.add_cookies([{"name": SESSION_COOKIE, "value": operator,
                                      "domain": host, "path": "/ui"}])
    await page2.goto(f"/ui/executions/{eid}")
    flows.FIXED.add(eid)
    await page2.locator("#redrive").click()
    await page2.locator("#confirm-redrive").click()
    await expect(page2.locator("#notice")).to_contain_text("ship")
    await wait_status(ui.store, eid, "completed", timeout=UI_WAIT)
    redriven = [e for e in await ui.store.history.events(eid) if e["kind"] == "redriven"]
    assert redriven[0]["detail"]["by"] == "ops-omar"
    # With authentication on, the nav shows the operations page to an operator.
    await page2.locator("nav a", has_text="Operations").click()
    await expect(page2.locator("h1")).to_have_text("Bulk operations")


ODD_GETS = [
    "/ui/operations?x=%00", "/ui/operations/op-", "/ui/operations/%00",
    "/ui/operations/op-0123456789abcdef", "/ui/operations/op-0123456789ABCDEF",
    "/ui/operations/" + "a" * 5000, "/ui/operations/op-0123456789abcdef/cancel",
    "/ui/executions/ok-1/redrive", "/ui/executions/ok-1/fork", "/ui/executions/ok-1/terminate",
    "/ui/executions/%00/redrive", "/ui/executions/no-such/fork",
    "/ui/executions/ok-1?done=redriven&redrive=x", "/ui/executions/ok-1?done=redriven",
    "/ui/executions/ok-1?done=forked", "/ui/executions/ok-1?done=redriven&redrive=99999999999999",
]

FORM = {"content-type": "application/x-www-form-urlencoded"}
ODD_FORMS = [
    ("/ui/executions/ok-1/redrive", {"fromStep": "\x00"}),
    ("/ui/executions/ok-1/redrive", {"fromStep": "a b", "reason": "x" * 3000}),
    ("/ui/executions/ok-1/redrive", {"timeoutSeconds": "-1"}),
    ("/ui/executions/ok-1/redrive", {"timeoutSeconds": "1e400"}),
    ("/ui/executions/no-such/redrive", {}),
    ("/ui/executions/%00/redrive", {}),
    ("/ui/executions/ok-1/fork", {}),
    ("/ui/executions/ok-1/fork", {"fromStep": "nap", "params": "[" * 500}),
    ("/ui/executions/ok-1/fork", {"fromStep": "nap", "params": '"\\u0000"'}),
    ("/ui/executions/ok-1/fork", {"fromStep": "nap", "executionId": "a~b"}),
    ("/ui/executions/ok-1/fork", {"fromStep": "nap", "executionId": "a" * 300}),
    ("/ui/executions/ok-1/fork", {"fromStep": "no-such-step"}),
    ("/ui/executions/no-such/fork", {"fromStep": "nap"}),
    ("/ui/executions/no-such/terminate", {}),
    ("/ui/operations", {}),
    ("/ui/operations", {"action": "explode", "workflowId": "ui-sleep"}),
    ("/ui/operations", {"action": "cancel", "status": "nope", "do": "start"}),
    ("/ui/operations", {"action": "cancel", "admittedFrom": "99999-01-01"}),
    ("/ui/operations", {"action": "cancel", "admittedTo": "0001-01-01T00:00+14:00"}),
    ("/ui/operations", {"action": "cancel", "minUnacknowledgedDeliveries": "9" * 30}),
    ("/ui/operations", {"action": "cancel", "executionIds": "ok-1 <script>"}),
    ("/ui/operations", {"action": "redrive", "executionIds": "ok-1", "fromStep": "\x00",
                        "timeoutSeconds": "x", "do": "start"}),
    ("/ui/operations", {"action": "cancel", "executionIds": "no-such", "reason": "\x00"}),
    ("/ui/operations/op-0123456789abcdef/cancel", {}),
    ("/ui/operations/nope/cancel", {}),
]


@pytest.mark.parametrize("auth", ["disabled", "enabled"])
async def test_no_request_to_the_new_pages_is_a_500(open_ui, auth):
    ui = await open_ui(auth=auth, worker=False)
    await admit(ui.store, "ui-sleep", params={}, execution_id="ok-1")
    cookies = {}
    if auth == "enabled":
        cookies[SESSION_COOKIE] = await sign_in(ui.base, await ui.token("operate", "fuzzer"))
    async with httpx.AsyncClient(base_url=ui.base, cookies=cookies, timeout=15) as client:
        for path in ODD_GETS:
            _check_page(await client.get(path), f"GET {path}")
        page = (await client.get("/ui/operations")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        for path, fields in ODD_FORMS:
            response = await client.post(path, data={"csrf": csrf, **fields})
            _check_page(response, f"POST {path} {fields}")
            assert response.status_code >= 400, (path, fields, response.status_code)
        for path in ("/ui/executions/ok-1/redrive", "/ui/operations"):
            response = await client.post(path, headers=FORM, content=b"csrf=%FF%FE")
            _check_page(response, f"POST {path} bad bytes")
            response = await client.post(path, data={"csrf": csrf},
                                         headers={"origin": "http://evil.example"})
            assert response.status_code == 403, path
    # Nothing odd acted on it, and no operation was created.
    assert (await ui.store.history.get("ok-1"))["status"] == "admitted"
    assert await ui.store.pool.fetchval("SELECT count(*) FROM operations") == 0
