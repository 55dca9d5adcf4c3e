"""Issue 16 in a real browser: an execution parked for nondeterminism is
resumable from its page, and the page says what Resume does (due again on
its own code version, parked again if the code still does not fit) and that
moving it to another code version is the other way; a move is an event in
words on the timeline. A poison park keeps its own words. A bulk resume takes
a nondeterminism park and says why it refuses what is not parked."""

from __future__ import annotations

from playwright.async_api import expect

from tests.support.admission import admit

DIVERGENCE = {"position": 1, "recorded": "ship", "asked": "pack",
              "message": "the code asked for 'pack' where the history recorded 'ship'"}


async def parked_for_nondeterminism(store, eid: str, version: str) -> None:
    await admit(store, "ui-echo", eid, params={}, code_version=version)
    [d] = await store.leases.claim_due(1, 30, "ui-w", ["ui-echo"])
    assert d.lease.execution_id == eid
    assert await store.effects.park(d.lease, "nondeterminism", "pack", DIVERGENCE) == "parked"


async def status_of(store, eid: str) -> tuple[str, str | None]:
    row = await store.pool.fetchrow(
        "SELECT status, parked_reason FROM executions WHERE execution_id = $1", eid)
    return row["status"], row["parked_reason"]


async def test_a_nondeterminism_park_is_resumed_from_its_page(open_ui):
    ui = await open_ui(worker=False)
    await parked_for_nondeterminism(ui.store, "nd-resume", "v7")
    page = await ui.page()
    await page.goto("/ui/executions/nd-resume")

    await expect(page.locator("#resume")).to_be_enabled()
    await expect(page.locator("#resume")).to_have_attribute(
        "title", "make it due again on its code version")
    hint = page.locator("#resume-hint")
    await expect(hint).to_contain_text("Resume makes it due again on its code version (v7)")
    await expect(hint).to_contain_text(
        "once the code deployed for that version fits its history again")
    await expect(hint).to_contain_text("if it still does not fit, the next delivery parks it "
                                       "again")
    await expect(hint).to_contain_text("The other way is to move it to a code version whose "
                                       "code fits")
    await expect(hint.locator("code")).to_have_text(
        "fencepost executions move-version nd-resume --to VERSION")
    todo = page.locator("#why .todo")
    await expect(todo).to_contain_text("then resume it")
    await expect(todo).to_contain_text("or move it to a code version whose code fits")
    # The poison words are not said of it.
    await expect(page.locator("#actions")).not_to_contain_text("unacknowledged delivery")
    await ui.shot(page, "nondeterminism-resume")

    await page.locator("#resume").click()
    await expect(page.locator("#notice")).to_have_text("Resumed: it is due again.")
    assert await status_of(ui.store, "nd-resume") == ("admitted", None)
    await expect(page.locator("#resume")).to_have_count(0)
    await expect(page.locator("#resume-hint")).to_have_count(0)
    await expect(page.locator("li.ev.k-resumed .kind")).to_have_text("resumed by an operator")
    await expect(page.locator("#code-version")).to_have_text("v7")


async def test_a_move_is_an_event_in_words(open_ui):
    ui = await open_ui(worker=False)
    await parked_for_nondeterminism(ui.store, "nd-move", "v7")
    answer, moved = await ui.store.versions.move("nd-move", "v8", by="alice", check="skipped",
                                                 reason="v8 fits")
    assert answer == "moved" and moved is not None and moved.resumed, (answer, moved)
    page = await ui.page()
    await page.goto("/ui/executions/nd-move")
    event = page.locator("li.ev.k-version_moved")
    await expect(event.locator(".kind")).to_have_text(
        "moved to another code version by an operator")
    for said in ('"from": "v7"', '"to": "v8"', '"by": "alice"', '"resumed": true'):
        await expect(event.locator(".detail")).to_contain_text(said)
    await expect(page.locator("#code-version")).to_have_text("v8")
    await expect(page.locator("#resume")).to_have_count(0)


async def test_a_poison_park_keeps_its_words(open_ui):
    ui = await open_ui(worker=False)
    await admit(ui.store, "ui-echo", "poisoned", params={})
    [d] = await ui.store.leases.claim_due(1, 30, "ui-w", ["ui-echo"])
    await ui.store.pool.execute("UPDATE executions SET unacknowledged_deliveries = 1000 "
                                "WHERE execution_id = 'poisoned'")
    await ui.store.leases.release(d.lease)
    assert await status_of(ui.store, "poisoned") == ("parked", "poison")
    page = await ui.page()
    await page.goto("/ui/executions/poisoned")
    await expect(page.locator("#resume")).to_have_attribute(
        "title", "make it due again; its counter is kept")
    await expect(page.locator("#actions")).to_contain_text(
        "Resume makes it due again; one more unacknowledged delivery parks it again.")
    await expect(page.locator("#resume-hint")).to_have_count(0)


async def test_a_bulk_resume_takes_a_nondeterminism_park_and_says_why_not_others(open_ui):
    ui = await open_ui(worker=False)  # the test carries the operation out, as a worker does
    await parked_for_nondeterminism(ui.store, "nd-bulk", "v7")
    await admit(ui.store, "ui-echo", "not-parked", params={})
    page = await ui.page()
    await page.goto("/ui/operations")
    form = page.locator("form.bulk")
    await expect(form.locator("select[name=action] option[value=resume]")).to_contain_text(
        "resume each one parked as poison or for nondeterminism")
    await form.locator("select[name=action]").select_option("resume")
    await form.locator("textarea[name=executionIds]").fill("nd-bulk not-parked")
    await page.locator("#count").click()
    await expect(page.locator("#counted .matched")).to_have_text("2")
    await page.locator("#start").click()
    await expect(page.locator("#op-status")).to_have_text("running")
    assert await ui.store.operations.run_operation_batch() == 2
    await expect(page.locator("#op-status")).to_have_text("completed", timeout=10_000)
    await expect(page.locator("#op-failed")).to_have_text("1")
    failures = page.locator("table.failures tbody tr")
    await expect(failures).to_have_count(1)
    await expect(failures.first).to_contain_text("not-parked")
    await expect(failures.first).to_contain_text("EXECUTION_NOT_PARKED")
    await expect(failures.first).to_contain_text(
        "execution is admitted, not parked as poison or for nondeterminism")
    assert await status_of(ui.store, "nd-bulk") == ("admitted", None)
