"""Acting on failures from the dashboard, in a real browser: redrive a failed
execution in place and see it complete, fork from a step, terminate, a bulk
cancel by workflow (dry-run count first, then progress to done), stopping an
operation, and the refusals as pages."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.async_api import expect

from tests.support.admission import admit
from tests.support.waiting import wait_record, wait_status
from tests.ui import flows
from tests.ui.helpers import UI_WAIT, form_csrf, reload_until_text


@pytest.fixture(autouse=True)
def _fresh_flows():
    flows.FIXED.clear()
    flows.CALLS.clear()


async def test_redrive_a_failed_execution_from_its_page(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-ship", params={"note": "box-7"}, execution_id="ship-1")
    await wait_status(ui.store, eid, "failed", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await expect(page.locator("#status")).to_have_text("failed")
    await page.locator("#redrive").click()

    # The confirmation: the recorded steps in order, and the cut rule in words.
    confirm = page.locator("section.confirm")
    await expect(page.locator("#confirm-title")).to_contain_text("Redrive execution")
    rows = confirm.locator("table.recorded tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("reserve")
    await expect(rows.nth(0)).to_contain_text("completed")
    await expect(rows.nth(1)).to_contain_text("ship")
    await expect(rows.nth(1)).to_contain_text("failed")
    await expect(confirm).to_contain_text("from the first failed step")
    await expect(confirm).to_contain_text("same execution ID")
    options = await confirm.locator("select[name=fromStep] option").all_inner_texts()
    assert [o.split()[0] for o in options[1:]] == ["reserve", "ship"], options
    await ui.shot(page, "confirm-redrive")
    assert (await ui.store.history.get(eid))["status"] == "failed"

    flows.FIXED.add(eid)  # the warehouse is back
    await confirm.locator("input[name=reason]").fill("warehouse back")
    await page.locator("#confirm-redrive").click()
    await expect(page).to_have_url(re.compile(f"/ui/executions/{eid}\\?done=redriven&redrive=1$"))
    await expect(page.locator("#notice")).to_contain_text("Redriven")
    await expect(page.locator("#notice")).to_contain_text("ship")
    await wait_status(ui.store, eid, "completed", timeout=UI_WAIT)
    await reload_until_text(page, "#status", "completed")
    await expect(page.locator("#outcome")).to_contain_text("shipped box-7")
    # The failed attempt is kept, shown as superseded by redrive 1.
    superseded = page.locator("table.steps tbody tr.superseded")
    await expect(superseded).to_have_count(1)
    await expect(superseded).to_contain_text("ship")
    await expect(superseded).to_contain_text("redrive 1")
    await expect(superseded).to_contain_text("LookupError")
    await expect(page.locator("ol.timeline")).to_contain_text("redriven")
    await ui.shot(page, "execution-completed-after-redrive")
    assert flows.CALLS.count((eid, "reserve")) == 1  # replayed, never run again
    assert flows.CALLS.count((eid, "ship")) == 2
    redriven = [e for e in await ui.store.history.events(eid) if e["kind"] == "redriven"]
    assert redriven[0]["detail"]["by"] == "anonymous"
    assert redriven[0]["detail"]["reason"] == "warehouse back"
    assert redriven[0]["detail"]["superseded"] == ["ship"]


async def test_a_completed_execution_is_redriven_from_a_chosen_step(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-ship", params={"note": "n"}, execution_id="ship-done")
    flows.FIXED.add(eid)
    await wait_status(ui.store, eid, "completed", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await page.locator("#redrive").click()
    confirm = page.locator("section.confirm")
    await expect(confirm).to_contain_text("It completed: choose the step")
    # Without a step: refused with a page saying what to do.
    await page.locator("#confirm-redrive").click()
    await expect(page.locator("h1")).to_contain_text("REDRIVE_NEEDS_FROM_STEP")
    await expect(page.locator(".message")).to_contain_text("choose the step")
    await page.go_back()
    await page.locator("select[name=fromStep]").select_option("ship")
    await page.locator("#confirm-redrive").click()
    await expect(page.locator("#notice")).to_contain_text("ship")
    await wait_record(ui.store, eid, lambda r: r["status"] == "completed" and r["redrives"] == 1,
                      what="completed again", timeout=UI_WAIT)
    assert flows.CALLS.count((eid, "reserve")) == 1
    assert flows.CALLS.count((eid, "ship")) == 2


async def test_fork_from_a_step_then_bad_params_are_a_clear_error(open_ui):
    ui = await open_ui()
    src = await admit(ui.store, "ui-ship", params={"note": "first"}, execution_id="fork-src")
    flows.FIXED.update({src, "fork-copy"})
    await wait_status(ui.store, src, "completed", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{src}")
    await page.locator("#fork").click()
    confirm = page.locator("section.confirm")
    await expect(page.locator("#confirm-title")).to_contain_text("Fork execution")
    await expect(confirm).to_contain_text("new idempotency keys")

    # Params that are not JSON: the form again, saying so; nothing admitted.
    await confirm.locator("select[name=fromStep]").select_option("ship")
    await confirm.locator("input[name=executionId]").fill("fork-copy")
    await confirm.locator("textarea[name=params]").fill("{nope")
    await page.locator("#confirm-fork").click()
    await expect(page.locator(".problem")).to_contain_text("INVALID_PARAMS")
    await expect(page.locator(".problem")).to_contain_text("params")
    await ui.shot(page, "confirm-fork-bad-params")
    assert await ui.store.history.get("fork-copy") is None

    await confirm.locator("select[name=fromStep]").select_option("ship")
    await confirm.locator("textarea[name=params]").fill('{"note": "second"}')
    await ui.shot(page, "confirm-fork")
    await page.locator("#confirm-fork").click()
    await expect(page).to_have_url(re.compile(r"/ui/executions/fork-copy\?done=forked$"))
    await expect(page.locator("#notice")).to_contain_text("Forked from fork-src")
    await wait_status(ui.store, "fork-copy", "completed", timeout=UI_WAIT)
    await reload_until_text(page, "#status", "completed")
    await expect(page.locator("#outcome")).to_contain_text("shipped second")
    await expect(page.locator("#forked-from")).to_contain_text("fork-src")
    await ui.shot(page, "execution-forked")
    # reserve was copied (not run under the new ID); ship ran again with the new params.
    assert flows.CALLS.count(("fork-copy", "reserve")) == 0
    assert flows.CALLS.count(("fork-copy", "ship")) == 1
    # The same ID again is a conflict page, never a 500.
    await page.goto(f"/ui/executions/{src}/fork")
    await page.locator("select[name=fromStep]").select_option("ship")
    await page.locator("input[name=executionId]").fill("fork-copy")
    await page.locator("#confirm-fork").click()
    await expect(page.locator("h1")).to_contain_text("EXECUTION_ID_CONFLICT")


async def test_terminate_runs_no_code(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-sleep", params={}, execution_id="nap-term")
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                      what="asleep", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await page.locator("#terminate").click()
    confirm = page.locator("section.confirm")
    await expect(page.locator("#confirm-title")).to_contain_text("Terminate execution")
    await expect(confirm).to_contain_text("no code runs")
    await expect(confirm).to_contain_text("cleanup itself is stuck")
    await ui.shot(page, "confirm-terminate")
    assert (await ui.store.history.get(eid))["status"] == "suspended"
    await page.locator("#confirm-terminate").click()
    await expect(page.locator("#notice")).to_contain_text("Terminated")
    await expect(page.locator("#status")).to_have_text("cancelled")
    record = await ui.store.history.get(eid)
    assert record["status"] == "cancelled"
    assert record["outcome"]["error"]["message"] == "terminated at the request of anonymous"


async def test_refusals_are_pages(open_ui):
    ui = await open_ui()
    eid = await admit(ui.store, "ui-sleep", params={}, execution_id="nap-busy")
    await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                      what="asleep", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto(f"/ui/executions/{eid}")
    await expect(page.locator("#redrive")).to_have_count(0)  # nothing to redrive
    response = await page.goto(f"/ui/executions/{eid}/redrive")
    assert response.status == 409
    await expect(page.locator("h1")).to_contain_text("EXECUTION_NOT_ENDED")
    await expect(page.locator(".message")).to_contain_text("cancel it first, or wait")
    await ui.shot(page, "error-redrive-running")
    await page.goto(f"/ui/executions/{eid}")
    csrf = await form_csrf(page)
    answer = await page.request.post(f"/ui/executions/{eid}/redrive", form={"csrf": csrf})
    assert answer.status == 409 and "EXECUTION_NOT_ENDED" in await answer.text()
    answer = await page.request.post(f"/ui/executions/{eid}/redrive",
                                     form={"csrf": csrf, "fromStep": "no-such-step"})
    assert answer.status == 409, answer.status
    answer = await page.request.post(f"/ui/executions/{eid}/fork",
                                     form={"csrf": csrf, "fromStep": "no-such-step"})
    assert answer.status == 422 and "STEP_NOT_FOUND" in await answer.text()
    answer = await page.request.post(f"/ui/executions/{eid}/redrive", form={"csrf": "forged"})
    assert answer.status == 403 and "CSRF_TOKEN_MISMATCH" in await answer.text()
    assert (await ui.store.history.get(eid))["status"] == "suspended"


async def test_bulk_cancel_by_workflow_count_first_then_progress(open_ui):
    ui = await open_ui()
    naps = [await admit(ui.store, "ui-sleep", params={}, execution_id=f"bulk-nap-{i}") for i in range(5)]
    other = await admit(ui.store, "ui-echo", params={"keep": True})
    for eid in naps:
        await wait_record(ui.store, eid, lambda r: r["status"] == "suspended" and r["waiting_on"],
                          what="asleep", timeout=UI_WAIT)
    await wait_status(ui.store, other, "completed", timeout=UI_WAIT)
    page = await ui.page()
    await page.goto("/ui")
    await page.locator("nav a", has_text="Operations").click()
    await expect(page).to_have_url(re.compile(r"/ui/operations$"))
    form = page.locator("form.bulk")
    await form.locator("select[name=action]").select_option("cancel")
    await form.locator("select[name=workflowId]").select_option("ui-sleep")
    await form.locator("select[name=status]").select_option("suspended")
    await ui.shot(page, "operations-form")
    await page.locator("#count").click()
    counted = page.locator("#counted")
    await expect(counted.locator(".matched")).to_have_text("5")
    await expect(counted).to_contain_text("bulk-nap-0")
    await ui.shot(page, "operations-dry-run")
    # A count acts on nothing.
    for eid in naps:
        assert (await ui.store.history.get(eid))["status"] == "suspended"

    await page.locator("#start").click()
    await expect(page).to_have_url(re.compile(r"/ui/operations/op-[0-9a-f]{16}$"))
    await expect(page.locator("#op-matched")).to_have_text("5")
    # The page refreshes itself while it runs; wait for it to show completed.
    await expect(page.locator("#op-status")).to_have_text("completed", timeout=30_000)
    await expect(page.locator("#op-done")).to_have_text("5")
    await expect(page.locator("#op-pending")).to_have_text("0")
    await expect(page.locator("#stop")).to_have_count(0)
    await ui.shot(page, "operation-completed")
    for eid in naps:
        record = await wait_status(ui.store, eid, "cancelled", timeout=UI_WAIT)
        assert record["cancel_requested_by"].startswith("anonymous (operation op-")
    assert (await ui.store.history.get(other))["status"] == "completed"


async def test_bulk_redrive_shows_failures_then_a_stop(open_ui):
    ui = await open_ui(worker=False)  # the test carries the operation out, as a worker does
    for i in range(3):
        await admit(ui.store, "ui-echo", params={}, execution_id=f"wait-{i}")
    page = await ui.page()
    await page.goto("/ui/operations")
    form = page.locator("form.bulk")
    await form.locator("select[name=action]").select_option("redrive")
    await form.locator("textarea[name=executionIds]").fill("wait-0 wait-1\nwait-2,wait-0")
    await form.locator("input[name=reason]").fill("try again")
    await page.locator("#count").click()
    await expect(page.locator("#counted .matched")).to_have_text("3")
    await page.locator("#start").click()
    await expect(page.locator("#op-status")).to_have_text("running")
    await expect(page.locator("#op-pending")).to_have_text("3")
    await expect(page.locator("meta[http-equiv=refresh]")).to_have_count(1)
    # Carried out: none of them had ended, so each is a failure with its code.
    # The page was not reloaded by the test: it refreshes itself while running.
    assert await ui.store.operations.run_operation_batch() == 3
    await expect(page.locator("#op-status")).to_have_text("completed", timeout=10_000)
    await expect(page.locator("#op-failed")).to_have_text("3")
    failures = page.locator("table.failures tbody tr")
    await expect(failures).to_have_count(3)
    await expect(failures.first).to_contain_text("EXECUTION_NOT_ENDED")
    await expect(page.locator("#stop")).to_have_count(0)
    await expect(page.locator("meta[http-equiv=refresh]")).to_have_count(0)
    await ui.shot(page, "operation-with-failures")

    # A second one, stopped before any worker takes it.
    await page.goto("/ui/operations")
    await form.locator("select[name=action]").select_option("cancel")
    await form.locator("select[name=workflowId]").select_option("ui-echo")
    await page.locator("#count").click()
    await page.locator("#start").click()
    await expect(page.locator("#op-status")).to_have_text("running")
    csrf = await form_csrf(page)
    await page.locator("#stop").click()
    await expect(page.locator("#notice")).to_contain_text("Stopped")
    await expect(page.locator("#op-status")).to_have_text("cancelled")
    await expect(page.locator("#op-pending")).to_have_text("3")
    await ui.shot(page, "operation-stopped")
    assert await ui.store.operations.run_operation_batch() == 0  # nothing of it is carried out
    for i in range(3):
        assert (await ui.store.history.get(f"wait-{i}"))["status"] == "admitted"
    # Stopping it again is refused with a page.
    answer = await page.request.post(page.url.split("?")[0] + "/cancel", form={"csrf": csrf})
    assert answer.status == 409 and "OPERATION_FINISHED" in await answer.text()


async def test_bulk_refusals_are_pages(open_ui):
    ui = await open_ui(worker=False)
    page = await ui.page()
    await page.goto("/ui/operations")
    # No condition at all: a problem on the form, not an operation over everything.
    await page.locator("#count").click()
    await expect(page.locator(".problem")).to_contain_text("at least one condition")
    await expect(page.locator("#start")).to_have_count(0)
    response = await page.goto("/ui/operations/op-0000000000000000")
    assert response.status == 404
    await expect(page.locator("h1")).to_contain_text("OPERATION_NOT_FOUND")
    async with httpx.AsyncClient(base_url=ui.base, timeout=15) as client:
        for path in ("/ui/operations/nope", "/ui/operations/op-zz", "/ui/operations/%00"):
            assert (await client.get(path)).status_code == 404, path
        r = await client.post("/ui/operations", data={"csrf": "x", "do": "start"})
        assert r.status_code == 403
