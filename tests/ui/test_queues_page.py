"""The dashboard's queues page (issue 15, Visible), in a real browser: each
queue's effective limits and where they come from (code or run time), its
running / due / held-back counts, the executions waiting on it with their
blockedBy in words; pause and resume (role operate, CSRF as every acting
POST, through app/commands/queues.py); an execution's queue, key and priority."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from app.ui.routes import SESSION_COOKIE
from tests.support.admission import admit
from tests.ui.helpers import form_csrf, sign_in

pytestmark = pytest.mark.timeout(90)


async def _mail_queue(store) -> None:
    """mail: concurrency 1 declared in code, a rate limit set at run time;
    m-0 holds the slot (claimed by a holder that is not a worker of this
    test), m-1 and m-2 wait on it."""
    await store.queues.declare({"mail": {"concurrency": 1}})
    await store.queues.change("mail", {"rate_limit": 50, "rate_period": 60.0}, actor="ops")
    await admit(store, "ui-echo", "m-0", params={}, queue="mail", concurrency_key="acme")
    [d] = await store.leases.claim_due(1, 300, "holder-x")
    assert d.lease.execution_id == "m-0"
    await admit(store, "ui-echo", "m-1", params={}, queue="mail", concurrency_key="acme",
                priority=5)
    await admit(store, "ui-echo", "m-2", params={}, queue="mail", priority=-3)


async def test_the_queues_page_shows_limits_counts_and_what_waits_then_pause_and_resume(
        open_ui) -> None:
    ui = await open_ui(worker=False)
    await _mail_queue(ui.store)
    page = await ui.page()
    await page.goto("/ui")
    await page.locator("nav a", has_text="Queues").click()
    await expect(page.locator("h1")).to_have_text("Queues")
    await expect(page.locator("nav a[aria-current=page]")).to_have_text("Queues")

    mail = page.locator("section#queue-mail")
    await expect(mail.locator(".counts .running")).to_have_text("1")
    await expect(mail.locator(".counts .due")).to_have_text("2")
    await expect(mail.locator(".counts .limited")).to_have_text("2")
    limits = mail.locator("table.limits")
    await expect(limits.locator("tr", has_text="Concurrency").first).to_contain_text("set in code")
    await expect(limits.locator("tr", has_text="Rate limit")).to_contain_text(
        "50 starts per 60 s")
    await expect(limits.locator("tr", has_text="Rate limit")).to_contain_text("set at run time")
    await expect(limits.locator("tr", has_text="Per-key concurrency")).to_contain_text(
        "no limit")
    # Waiting, in claim order (priority first), with why in words.
    rows = mail.locator("table.waiting tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("m-2")
    await expect(rows.nth(1)).to_contain_text("m-1")
    await expect(rows.nth(1)).to_contain_text("acme")
    await expect(rows.nth(0)).to_contain_text("concurrency limit: queue “mail” (1/1)")
    default = page.locator("section#queue-default")
    await expect(default.locator(".counts .due")).to_have_text("0")
    await ui.shot(page, "queues")

    await page.locator("#pause-mail").click()
    await expect(page).to_have_url(re.compile(r"/ui/queues\?done=paused$"))
    await expect(page.locator("#notice")).to_contain_text("Paused")
    await expect(page.locator("#paused-mail")).to_be_visible()
    await expect(rows.nth(0)).to_contain_text("queue “mail” paused")
    assert (await ui.store.queues.get("mail"))["paused"] is True
    changes = await ui.store.queues.changes("mail")
    assert changes[0]["actor"] == "anonymous", changes
    await ui.shot(page, "queues-paused")

    await page.locator("#resume-mail").click()
    await expect(page.locator("#notice")).to_contain_text("Resumed")
    await expect(page.locator("#paused-mail")).to_have_count(0)
    await expect(rows.nth(0)).to_contain_text("concurrency limit")
    assert (await ui.store.queues.get("mail"))["paused"] is False

    # An execution's page names its queue, key and priority, and why it waits.
    await rows.nth(1).locator("a").click()
    await expect(page.locator("#queue")).to_have_text("mail")
    await expect(page.locator("#concurrency-key")).to_have_text("acme")
    await expect(page.locator("#priority")).to_contain_text("5")
    await expect(page.locator("#why")).to_contain_text("concurrency limit of queue “mail”")
    await expect(page.locator("#why")).to_contain_text("(1 of 1 running)")


async def test_pausing_needs_operate_a_valid_form_and_a_known_queue(open_ui) -> None:
    ui = await open_ui(auth="enabled", worker=False)
    await _mail_queue(ui.store)
    reader = await sign_in(ui.base, await ui.token("read", "reader-rita"))
    operator = await sign_in(ui.base, await ui.token("operate", "ops-omar"))
    host = re.sub(r"^http://|:\d+$", "", ui.base)

    page = await ui.page()
    await page.context.add_cookies([{"name": SESSION_COOKIE, "value": reader, "domain": host,
                                     "path": "/ui"}])
    await page.goto("/ui/queues")
    await expect(page.locator("#pause-mail")).to_be_disabled()
    await expect(page.locator("#needs-operate")).to_contain_text("operate")
    answer = await page.request.post("/ui/queues/mail/pause",
                                     form={"csrf": await form_csrf(page)})
    assert answer.status == 403, answer.status

    page2 = await ui.page()
    await page2.context.add_cookies([{"name": SESSION_COOKIE, "value": operator,
                                      "domain": host, "path": "/ui"}])
    await page2.goto("/ui/queues")
    csrf = await form_csrf(page2)
    answer = await page2.request.post("/ui/queues/mail/pause", form={"csrf": "forged"})
    assert answer.status == 403 and "CSRF_TOKEN_MISMATCH" in await answer.text()
    answer = await page2.request.post("/ui/queues/no-such-queue/pause", form={"csrf": csrf})
    assert answer.status == 404 and "QUEUE_NOT_FOUND" in await answer.text()
    assert await ui.store.queues.get("no-such-queue") is None
    assert (await ui.store.queues.get("mail"))["paused"] is False
    # A reloaded action URL shows the page.
    response = await page2.goto("/ui/queues/mail/pause")
    assert response.url.endswith("/ui/queues")

    await page2.locator("#pause-mail").click()
    await expect(page2.locator("#notice")).to_contain_text("Paused")
    changes = await ui.store.queues.changes("mail")
    assert changes[0]["actor"] == "ops-omar", changes
