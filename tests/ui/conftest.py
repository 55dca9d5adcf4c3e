"""Fixtures for the dashboard's browser tests: the real app served by uvicorn
on 127.0.0.1 (in a thread with its own event loop and pool) on the per-test
database, an in-process Worker running tests/ui/flows.py in the test's loop,
and Debian's Chromium driven by Playwright.

  browser   session  a headless Chromium (/usr/bin/chromium). Missing: the tests FAIL
                     (run `make browser`); nothing is skipped.
  open_ui   function `ui = await open_ui(auth="disabled", worker=True)` starts a server
                     (and a worker) and returns a UI: ui.base, ui.store,
                     `await ui.page()` (a fresh browser context; every request to
                     another origin is aborted and recorded, every dialog recorded),
                     `await ui.shot(page, name)` (test-artifacts/ui/NAME.png).
                     After the test: no request left the origin, no dialog opened,
                     no console error (a CSP violation would be one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from app.api.app import create_app
from app.api.auth import new_token
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.worker import Worker
from tests.support.live_server import ServerThread
from tests.support.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
WORKFLOWS = load_workflows(["tests.ui.flows"])
assert sorted(WORKFLOWS) == ["ui-charge", "ui-echo", "ui-ship", "ui-sleep"], sorted(WORKFLOWS)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: the dashboard tests need Debian's chromium (run `make browser`)"
    )
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@dataclass
class UI:
    base: str
    settings: Settings
    store: ExecutionStore
    browser: Browser
    contexts: list[BrowserContext] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    async def page(self) -> Page:
        context = await self.browser.new_context(viewport={"width": 1360, "height": 900},
                                                 base_url=self.base)
        self.contexts.append(context)

        async def guard(route) -> None:
            url = route.request.url
            if url.startswith(self.base + "/") or url.startswith(("data:", "about:")):
                await route.continue_()
            else:
                self.foreign.append(url)
                await route.abort()

        await context.route("**/*", guard)
        page = await context.new_page()

        async def on_dialog(dialog) -> None:
            self.dialogs.append(f"{dialog.type}: {dialog.message}")
            await dialog.dismiss()

        page.on("dialog", on_dialog)
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error"
                and "status of 4" not in m.text else None)
        page.set_default_timeout(15_000)
        return page

    async def shot(self, page: Page, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        return path

    async def token(self, role: str, name: str) -> str:
        token_id, token, digest = new_token()
        await self.store.tokens.create_token(token_id, name=name, role=role, secret_sha256=digest)
        return token


def ui_settings(settings: Settings, **changes) -> Settings:
    return settings.model_copy(update={
        "workflows": "", "auth": "disabled", "lease_seconds": 5, "renew_seconds": 0.5,
        "poll_seconds": 0.2, "redelivery_base_seconds": 0.05, "redelivery_cap_seconds": 0.5,
        "shutdown_grace_seconds": 2, **changes,
    })


@pytest_asyncio.fixture
async def open_ui(settings: Settings, pool: asyncpg.Pool, browser: Browser):
    async with contextlib.AsyncExitStack() as stack:
        opened: list[UI] = []

        async def _open(*, auth: str = "disabled", worker: bool = True) -> UI:
            s = ui_settings(settings, auth=auth)
            server = ServerThread(create_app(s, WORKFLOWS))
            await server.start()
            stack.push_async_callback(server.stop)
            store = ExecutionStore.from_settings(pool, s)
            if worker:
                w = Worker(s, WORKFLOWS, concurrency=4, worker_id="ui-test-worker-1")
                task = asyncio.create_task(w.run(), name="ui test worker")

                async def stop_worker() -> None:
                    w.request_stop()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(task, 15)

                stack.push_async_callback(stop_worker)

                def started() -> bool:
                    if task.done():
                        task.result()  # a worker that failed to start raises its error here
                    return w.store is not None

                await wait_until(started, timeout=10, what="the worker to start")
            ui = UI(f"http://127.0.0.1:{server.port}", s, store, browser)
            opened.append(ui)
            return ui

        yield _open
        for ui in opened:
            for context in ui.contexts:
                with contextlib.suppress(Exception):
                    await context.close()
    for ui in opened:
        assert not ui.foreign, f"requests to another origin: {ui.foreign}"
        assert not ui.dialogs, f"dialogs opened: {ui.dialogs}"
        assert not ui.console_errors, f"console errors: {ui.console_errors}"
