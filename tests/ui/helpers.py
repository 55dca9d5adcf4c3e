"""Small helpers for the dashboard tests: wait for a status, admit, backdate."""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import Page

from app.store import Admitted, ExecutionStore


async def admit(store: ExecutionStore, workflow_id: str, params: Any = None, *,
                execution_id: str | None = None) -> str:
    result = await store.admissions.admit(workflow_id=workflow_id, params=params if params is not None else {},
                               execution_id=execution_id)
    assert isinstance(result, Admitted), result
    return result.execution_id


async def wait_record(store: ExecutionStore, execution_id: str, check, *, timeout: float = 15,
                      what: str = "condition") -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        record = await store.history.get(execution_id)
        if record is not None and check(record):
            return record
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out waiting for {what} on {execution_id}; last: "
                f"{record and {k: record[k] for k in ('status', 'parked_reason', 'waiting_on')}}"
            )
        await asyncio.sleep(0.05)


async def wait_status(store: ExecutionStore, execution_id: str, *statuses: str,
                      timeout: float = 15) -> dict:
    return await wait_record(store, execution_id, lambda r: r["status"] in statuses,
                             timeout=timeout, what=f"status in {statuses}")


async def reload_until_text(page: Page, selector: str, text: str, *, timeout: float = 15) -> None:
    """Reload `page` until `selector` contains `text` (the pages do not poll)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if text in await page.locator(selector).inner_text():
            return
        if loop.time() > deadline:
            raise AssertionError(f"{selector!r} never showed {text!r}")
        await asyncio.sleep(0.25)
        await page.reload()


async def sign_in(base: str, token: str) -> str:
    """Sign in to the dashboard at `base` with `token`; the session cookie's value
    (a random session ID: the token itself is never a cookie)."""
    import httpx

    from app.ui.routes import SESSION_COOKIE

    async with httpx.AsyncClient(base_url=base, timeout=15) as client:
        r = await client.post("/ui/login", data={"token": token, "next": "/ui"})
    assert r.status_code == 303, r.text
    for header in r.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name == SESSION_COOKIE:
            return rest.split(";", 1)[0]
    raise AssertionError(f"no session cookie in {r.headers.get_list('set-cookie')}")


async def form_csrf(page: Page) -> str:
    return await page.locator("input[name=csrf]").first.get_attribute("value")
