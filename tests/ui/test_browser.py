"""The dashboard in a real browser (Playwright + Debian's Chromium): the list
and its filters, resolving an outcome-unknown step through the confirmation
and seeing the execution complete, cancelling a sleeping execution, user data
shown as text, the workers page, and the roles with authentication on."""

from __future__ import annotations

import re

from playwright.async_api import expect

from app.ui.routes import SESSION_COOKIE
from tests.support.admission import admit
from tests.support.waiting import wait_record, wait_status
from tests.ui.helpers import UI_WAIT, form_csrf, reload_until_text

SCRIPT = "<script>alert('fencepost-xss')</script>"
IMG = '<img src=x onerror="alert(1)">'


async def _seed_listing(ui) -> dict[str, int]:
    """Executions no worker runs, with unacknowledged-delivery counters set
    (tests move state by UPDATE, as the other suites do), and a last hour of
    activity for the chart."""
    counters = {"ui-idle-a": 0, "ui-idle-b": 2, "ui-idle-c": 7, "ui-idle-d": 12, "ui-idle-e": 1}
    for eid, n in counters.items():
        await admit(ui.store, "ui-idle", params={"order": eid}, execution_id=eid)
        await ui.store.pool.execute(
            "UPDATE executions SET unacknowledged_deliveries = $2, "
            "last_unacknowledged_at = CASE WHEN $2 > 0 THEN now() END WHERE execution_id = $1",
            eid, n)
    # Activity spread over the last hour: completions every minute, a few
    # failures and unacknowledged deliveries.
    await ui.store.pool.execute(
        """
        INSERT INTO execution_events (execution_id, bucket, kind, detail, at, seq)
        SELECT e.execution_id, fencepost_bucket(e.execution_id), e.kind, e.detail, e.at,
               1000 + row_number() OVER () FROM (
        SELECT 'ui-idle-a' AS execution_id, 'acknowledged' AS kind,
               jsonb_build_object('status', 'completed') AS detail,
               now() - make_interval(mins => m) - make_interval(secs => k) AS at
        FROM generate_series(1, 58) m, generate_series(1, 3 + (m % 7)) k
        UNION ALL
        SELECT 'ui-idle-b', 'acknowledged', jsonb_build_object('status', 'failed'),
               now() - make_interval(mins => m)
        FROM generate_series(5, 58, 9) m
        UNION ALL
        SELECT 'ui-idle-c', 'released', '{}'::jsonb, now() - make_interval(mins => m)
        FROM generate_series(20, 40, 2) m) e
        """
    )
    return counters


async def test_list_loads_filters_and_charts(open_ui):
    ui = await open_ui()
    counters = await _seed_listing(ui)
    done = await admit(ui.store, "ui-echo", params={"hello": "world"})
    await wait_status(ui.store, done, "completed", timeout=UI_WAIT)
    page = await ui.page()

    response = await page.goto("/ui")
    assert response.status == 200
    await expect(page.locator("h1")).to_have_text("Executions")
    await expect(page.locator("table.executions tbody tr")).to_have_count(6)
    await expect(page.locator(".count[data-status=admitted] .n")).to_have_text("5")
    await expect(page.locator(".count[data-status=completed] .n")).to_have_text("1")
    # No worker runs ui-idle: the list says so in words.
    row = page.locator("tr", has=page.get_by_role("link", name="ui-idle-d", exact=True))
    await expect(row.locator("td.blocked")).to_contain_text("no live worker")
    # The chart: three series over 60 minutes, drawn as inline SVG.
    chart = page.locator("svg.chart")
    await expect(chart.locator("polyline")).to_have_count(3)
    await expect(chart.locator("rect.hit")).to_have_count(60)
    legend = await page.locator(".legend").inner_text()
    assert "6 failures" in legend and "11 unacknowledged" in legend, legend
    await ui.shot(page, "executions")

    # One click to the executions with the most unacknowledged deliveries.
    await page.locator("#most-unacked").click()
    await expect(page).to_have_url(re.compile(r"minUnacknowledgedDeliveries=1"))
    ids = await page.locator("table.executions td.id a").all_inner_texts()
    assert ids == ["ui-idle-d", "ui-idle-c", "ui-idle-b", "ui-idle-e"], ids
    await ui.shot(page, "executions-most-unacknowledged")

    # The form: unacknowledged deliveries >= 5.
    await page.goto("/ui")
    await page.locator("input[name=minUnacknowledgedDeliveries]").fill("5")
    await page.get_by_role("button", name="Apply").click()
    await expect(page).to_have_url(re.compile(r"minUnacknowledgedDeliveries=5"))
    ids = await page.locator("table.executions td.id a").all_inner_texts()
    assert sorted(ids) == sorted(e for e, n in counters.items() if n >= 5), ids
    cells = await page.locator("table.executions td.num").all_inner_texts()
    assert all(int(c) >= 5 for c in cells), cells
    await ui.shot(page, "executions-filtered")

    # blockedBy and status filters, then a page size that paginates.
    await page.goto("/ui?blockedBy=none")
    assert await page.locator("table.executions td.id a").all_inner_texts() == [done]
    await page.goto("/ui?status=admitted&limit=25&sort=admitted-asc")
    ids = await page.locator("table.executions td.id a").all_inner_texts()
    assert ids == list(counters), ids

    # A filter that is not valid is a page saying so (422), not an error.
    response = await page.goto("/ui?minUnacknowledgedDeliveries=-1&status=nope")
    assert response.status == 422
    await expect(page.locator(".problem")).to_contain_text("minUnacknowledgedDeliveries")
    await expect(page.locator(".problem")).to_contain_text("status")


async def test_resolve_outcome_unknown_step_then_it_completes(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-charge", params={"amount": 4200}, execution_id="order-4200")
    await wait_record(ui.store, eid, lambda r: r["status"] == "parked",
                      what="parked on the charge", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto("/ui?blockedBy=parked")
    await page.get_by_role("link", name=eid, exact=True).click()
    await expect(page).to_have_url(re.compile(f"/ui/executions/{eid}$"))
    await expect(page.locator("#status")).to_have_text("parked")
    await expect(page.locator("#why .headline")).to_contain_text(
        "Parked: the outcome of step “charge” is unknown.")
    await expect(page.locator(".resolve .ikey")).to_have_text(f"{eid}:charge")
    await ui.shot(page, "execution-parked-outcome-unknown")

    # Say it succeeded; the review page says what will happen; nothing changed yet.
    form = page.locator("form.resolve-form")
    await form.get_by_label("It succeeded").check()
    await form.locator("textarea[name=result]").fill('{"chargeId": "ch_4200"}')
    await form.get_by_role("button", name="Review…").click()
    confirm = page.locator("section.confirm")
    await expect(confirm.locator("h2")).to_have_text("What will happen")
    await expect(confirm).to_contain_text("recorded as completed with this result")
    await expect(confirm).to_contain_text('"chargeId": "ch_4200"')
    await expect(confirm).to_contain_text("the function is not called again")
    await ui.shot(page, "confirm-resolve")
    assert (await ui.store.history.get(eid))["status"] == "parked"

    await page.locator("#confirm-resolve").click()
    await expect(page).to_have_url(re.compile(f"/ui/executions/{eid}\\?done=resolved$"))
    await expect(page.locator("#notice")).to_contain_text("Step resolved")
    await wait_status(ui.store, eid, "completed", timeout=UI_WAIT)
    await reload_until_text(page, "#status", "completed")
    await expect(page.locator("#outcome")).to_contain_text("rcpt-ch_4200")
    await expect(page.locator("ol.timeline")).to_contain_text("step resolved by an operator")
    await ui.shot(page, "execution-completed-after-resolve")
    resolved = [e for e in await ui.store.history.events(eid) if e["kind"] == "resolved"]
    assert resolved[0]["detail"] == {"stepKey": "charge", "action": "succeed", "by": "anonymous",
                                     "result": {"chargeId": "ch_4200"}}


async def test_review_refuses_a_result_that_is_not_json(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-charge", params={"amount": 1})
    await wait_status(ui.store, eid, "parked", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    form = page.locator("form.resolve-form")
    await form.get_by_label("It succeeded").check()
    await form.locator("textarea[name=result]").fill("{not json")
    await form.get_by_role("button", name="Review…").click()
    await expect(page.locator(".problem")).to_contain_text("INVALID_RESOLUTION")
    await expect(page.locator("#confirm-resolve")).to_have_count(0)
    assert (await ui.store.history.get(eid))["status"] == "parked"


async def test_cancel_a_sleeping_execution(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-sleep", params={}, execution_id="nap-1")
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                      what="asleep", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await expect(page.locator("#why .headline")).to_have_text(
        "Sleeping on the durable timer of step “nap”.")
    await expect(page.locator("#why .at")).to_contain_text("in 59 min")
    await ui.shot(page, "execution-sleeping")

    await page.locator("#cancel").click()
    await expect(page.locator("#confirm-title")).to_contain_text("Cancel execution")
    await expect(page.locator("section.confirm")).to_contain_text(
        "it is delivered once more, at once, so its cleanup code runs where it waits")
    await ui.shot(page, "confirm-cancel")
    await page.locator("#confirm-cancel").click()
    await expect(page.locator("#notice")).to_contain_text("Cancel requested")
    # The worker delivers it once more (its cleanup), then it is cancelled.
    await wait_record(ui.store, eid, lambda r: r["status"] == "cancelled", what="cancelled", timeout=UI_WAIT)
    await page.reload()
    await expect(page.locator("#status")).to_have_text("cancelled")
    await expect(page.locator("#outcome")).to_contain_text("Cancelled")
    await expect(page.locator("#actions")).to_contain_text("It has ended (cancelled)")
    await expect(page.locator("#cancel")).to_have_count(0)
    await expect(page.locator("#redrive")).to_be_visible()
    await ui.shot(page, "execution-cancelled")
    record = await ui.store.history.get(eid)
    assert record["status"] == "cancelled" and record["cancel_requested_by"] == "anonymous"


async def test_wake_now_asks_for_a_delivery(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-sleep", params={})
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                      what="asleep", timeout=UI_WAIT)
    claims = [e for e in await ui.store.history.events(eid) if e["kind"] == "claimed"]
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await page.locator("#wake").click()
    await expect(page.locator("#notice")).to_contain_text("Wake requested")
    await expect(page.locator("ol.timeline")).to_contain_text("wake requested")

    async def delivered_again() -> bool:
        events = await ui.store.history.events(eid)
        return len([e for e in events if e["kind"] == "claimed"]) > len(claims)

    # A delivery ran the code again; its durable timer still holds it asleep.
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["token"] == 2,
                      what="a second delivery", timeout=UI_WAIT)
    assert await delivered_again()


async def test_script_in_params_is_shown_as_text(open_ui):
    ui = await open_ui()
    params = {"note": SCRIPT, "html": IMG, "big": "x" * 400 + SCRIPT}
    eid = await admit(ui.store, "ui-echo", params=params, execution_id="xss-1")
    await wait_status(ui.store, eid, "completed", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto("/ui")
    await page.get_by_role("link", name=eid, exact=True).click()
    params_cell = page.locator("#params")
    await expect(params_cell).to_contain_text(SCRIPT)  # the text itself, not an element
    await expect(page.locator("#outcome")).to_contain_text(SCRIPT)
    # Large values are collapsed; opened, they show the text too.
    details = params_cell.locator("details")
    await expect(details).to_have_count(1)
    await details.locator("summary").click()
    await expect(details.locator("pre")).to_contain_text('"note": "' + SCRIPT)
    # No element was made from the user's data, and nothing ran.
    assert await page.locator("script").count() == 0
    assert await page.locator("img").count() == 0
    html = await (await page.request.get(f"/ui/executions/{eid}")).text()
    assert SCRIPT not in html and "&lt;script&gt;alert(" in html
    await ui.shot(page, "execution-with-script-in-params")
    assert ui.dialogs == []


async def test_workers_page(open_ui):
    ui = await open_ui()
    page = await ui.page()
    await page.goto("/ui/workers")
    row = page.locator("tr", has_text="ui-test-worker-1")
    await expect(row.locator(".badge")).to_have_text("alive")
    for wf in ("ui-charge", "ui-echo", "ui-sleep"):
        await expect(row.locator(".tag", has_text=wf)).to_have_count(1)
    await expect(row.locator("td.num").nth(1)).to_have_text("4")  # concurrency
    # The only worker leads both maintenance roles: the sweeps, and its workflows' schedules.
    await expect(row.locator(".role")).to_have_text(
        ["schedules ui-charge,ui-echo,ui-ship,ui-sleep", "sweeps"])
    await ui.shot(page, "workers")
    await page.locator("nav a", has_text="Executions").click()
    await expect(page).to_have_url(re.compile(r"/ui$"))


async def test_not_found_is_a_page(open_ui):
    ui = await open_ui(worker=False)
    page = await ui.page()
    response = await page.goto("/ui/executions/no-such-execution")
    assert response.status == 404
    await expect(page.locator("h1")).to_contain_text("EXECUTION_NOT_FOUND")
    await expect(page.locator(".message")).to_contain_text("no execution with ID 'no-such-execution'")
    await ui.shot(page, "error-not-found")


async def test_roles_with_authentication_on(open_ui):
    ui = await open_ui(auth="enabled")
    eid = await admit(ui.store, "ui-sleep", params={}, execution_id="nap-auth")
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                      what="asleep", timeout=UI_WAIT)
    reader_token = await ui.token("read", "reader-rita")
    operator_token = await ui.token("operate", "ops-omar")
    trigger_token = await ui.token("trigger", "ci-bot")

    # Nobody signed in: the login page, keeping where we were going.
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    await ui.shot(page, "login")
    # A wrong token, then a trigger-only one, are refused.
    await page.locator("#token").fill("fp_nope_nope")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".problem")).to_contain_text("UNAUTHENTICATED")
    await page.locator("#token").fill(trigger_token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".problem")).to_contain_text("FORBIDDEN")
    cookies = await page.context.cookies()
    assert not [c for c in cookies if c["name"] == SESSION_COOKIE]

    # A read token sees everything, and every action disabled.
    await page.locator("#token").fill(reader_token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(f"/ui/executions/{eid}$"))
    await expect(page.locator(".who .principal")).to_have_text("reader-rita")
    await expect(page.locator("#wake")).to_be_disabled()
    await expect(page.locator("#cancel")).to_be_disabled()
    await expect(page.locator("#needs-operate")).to_contain_text("role operate")
    await ui.shot(page, "execution-read-only")
    cookie = next(c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert cookie["secure"], "the session cookie is Secure by default"
    # What the browser keeps is a session ID, not the token: as a bearer token it opens nothing.
    assert reader_token not in {c["value"] for c in await page.context.cookies()}
    stolen = await page.request.get("/v1/executions",
                                    headers={"Authorization": f"Bearer {cookie['value']}"})
    assert stolen.status == 401
    # Sending the form anyway is refused with a page, and nothing changes.
    answer = await page.request.post(f"/ui/executions/{eid}/cancel",
                                     form={"csrf": await form_csrf(page)})
    assert answer.status == 403
    assert "FORBIDDEN" in await answer.text()
    response = await page.goto(f"/ui/executions/{eid}/cancel")
    assert response.status == 403
    await ui.shot(page, "forbidden-for-read")
    assert (await ui.store.history.get(eid))["status"] == "suspended"

    # An operate token acts, recorded under its name.
    page2 = await ui.page()
    await page2.goto("/ui/login")
    await page2.locator("#token").fill(operator_token)
    await page2.get_by_role("button", name="Sign in").click()
    await expect(page2).to_have_url(re.compile(r"/ui$"))
    await page2.get_by_role("link", name=eid, exact=True).click()
    await expect(page2.locator("#wake")).to_be_enabled()
    # Forms are bound to the session: no token field, or a cross-site origin, is refused.
    csrf = await form_csrf(page2)
    answer = await page2.request.post(f"/ui/executions/{eid}/cancel", form={"csrf": "forged"})
    assert answer.status == 403 and "CSRF_TOKEN_MISMATCH" in await answer.text()
    answer = await page2.request.post(f"/ui/executions/{eid}/cancel", form={"csrf": csrf},
                                      headers={"Origin": "http://evil.example"})
    assert answer.status == 403 and "CROSS_SITE_REQUEST" in await answer.text()
    assert (await ui.store.history.get(eid))["status"] == "suspended"

    await page2.locator("#cancel").click()
    await page2.locator("#confirm-cancel").click()
    await expect(page2.locator("#notice")).to_contain_text("Cancel requested")
    # The worker delivers it once more (its cleanup), then it is cancelled.
    await wait_record(ui.store, eid, lambda r: r["status"] == "cancelled", what="cancelled", timeout=UI_WAIT)
    await page2.reload()
    await expect(page2.locator("#status")).to_have_text("cancelled")
    record = await ui.store.history.get(eid)
    assert record["cancel_requested_by"] == "ops-omar"
    await ui.shot(page2, "execution-cancelled-by-operator")

    # Signing out ends the session: the browser drops the cookie, and a copy of it
    # kept from before opens nothing.
    kept = next(c for c in await page2.context.cookies() if c["name"] == SESSION_COOKIE)
    await page2.get_by_role("button", name="Sign out").click()
    await expect(page2).to_have_url(re.compile(r"/ui/login\?reason=signed-out"))
    assert not [c for c in await page2.context.cookies() if c["name"] == SESSION_COOKIE]
    await page2.goto("/ui")
    await expect(page2).to_have_url(re.compile(r"/ui/login"))
    await page2.context.add_cookies([kept])
    await page2.goto("/ui")
    await expect(page2).to_have_url(re.compile(r"/ui/login\?next=%2Fui&reason=ended"))


async def test_an_empty_service_says_how_to_start(open_ui):
    ui = await open_ui(worker=False)
    page = await ui.page()
    await page.goto("/ui")
    await expect(page.locator("#empty")).to_contain_text("Nothing admitted yet")
    await expect(page.locator("#empty")).to_contain_text("ui-charge, ui-echo, ui-ship, ui-sleep")
    await ui.shot(page, "executions-empty")
    await page.goto("/ui?status=failed")
    await expect(page.locator("#empty")).to_have_count(0)
    await expect(page.locator(".summary")).to_contain_text("No executions match")
