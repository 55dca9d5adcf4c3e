"""Issue 16 item 1 in a real browser: an execution no live worker can run
for its code version is found from the list (quick link and filter) and
explained on its page with its code version; a nondeterminism park shows
where code and history first disagree."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

from playwright.async_api import expect

from tests.support.admission import admit


@contextlib.asynccontextmanager
async def alive(store, worker_id: str) -> AsyncIterator[None]:
    """`worker_id` heartbeats (as a running worker would) while in the block."""
    async def beat() -> None:
        while True:
            await store.workers.heartbeat(worker_id)
            await asyncio.sleep(0.1)
    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_execution_no_worker_carries_the_version_of_is_visible(open_ui):
    ui = await open_ui(worker=False)
    await ui.store.workers.register_worker("ui-w-v2", host="t", pid=1, workflows=["ui-echo"],
                                           concurrency=1, versions={"ui-echo": "v2"})
    async with alive(ui.store, "ui-w-v2"):
        await _versions_visible(ui)


async def _versions_visible(ui) -> None:
    await admit(ui.store, "ui-echo", "ver-old", params={}, code_version="v1")
    await admit(ui.store, "ui-echo", "ver-new", params={}, code_version="v2")
    page = await ui.page()
    await page.goto("/ui")
    await page.locator("#no-worker-for-version").click()
    await expect(page).to_have_url(re.compile(r"blockedBy=no-worker-for-version"))
    await expect(page.locator("table.executions tbody tr")).to_have_count(1)
    row = page.locator("tr", has=page.get_by_role("link", name="ver-old", exact=True))
    await expect(row.locator("td.blocked")).to_contain_text("no worker with version “v1”")
    await expect(page.locator("select[name=blockedBy] option:checked")).to_have_text(
        "no live worker carries its code version")

    await row.get_by_role("link", name="ver-old", exact=True).click()
    await expect(page.locator("#why .headline")).to_have_text(
        "Waiting for a worker with version “v1” of workflow “ui-echo”.")
    await expect(page.locator("#code-version")).to_have_text("v1")
    await ui.shot(page, "no-worker-for-version")

    await page.goto("/ui/executions/ver-new")
    await expect(page.locator("#why .headline")).to_have_text("Due: waiting for a free worker.")


async def test_a_nondeterminism_park_shows_its_divergence(open_ui):
    ui = await open_ui(worker=False)
    await admit(ui.store, "ui-echo", "nd-page", params={}, code_version="v7")
    [d] = await ui.store.leases.claim_due(1, 30, "ui-w", ["ui-echo"])
    detail = {"position": 3, "recorded": "ship", "asked": "pack",
              "message": "the code asked for 'pack' where the history recorded 'ship'"}
    assert await ui.store.effects.park(d.lease, "nondeterminism", "pack", detail) == "parked"
    page = await ui.page()
    await page.goto("/ui?blockedBy=parked")
    row = page.locator("tr", has=page.get_by_role("link", name="nd-page", exact=True))
    await expect(row.locator("td.blocked")).to_have_text("parked: code diverged at “pack”")
    await row.get_by_role("link", name="nd-page", exact=True).click()
    await expect(page.locator("#why .headline")).to_have_text(
        "Parked: its code no longer fits its history at step “pack”.")
    await expect(page.locator("#divergence-position")).to_contain_text("ask 3")
    await expect(page.locator("#divergence-recorded")).to_have_text("ship")
    await expect(page.locator("#divergence-asked")).to_have_text("pack")
    await expect(page.locator("#divergence-message")).to_have_text(detail["message"])
    await expect(page.locator("#code-version")).to_have_text("v7")
    await ui.shot(page, "nondeterminism-park")
