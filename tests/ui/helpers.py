"""Small helpers for the dashboard tests: reload a page until it shows a text,
sign in, read a form's CSRF token. Admitting and waiting: tests/support."""

from __future__ import annotations

from playwright.async_api import Page

from tests.support.waiting import wait_until

# How long a dashboard test waits for an execution's state: a browser, a server
# thread and a worker share the machine, so longer than the suite's default.
UI_WAIT = 15.0


async def reload_until_text(page: Page, selector: str, text: str, *, timeout: float = 15) -> None:
    """Reload `page` until `selector` contains `text` (the pages do not poll)."""
    async def shows() -> bool:
        if text in await page.locator(selector).inner_text():
            return True
        await page.reload()
        return False

    await wait_until(shows, timeout=timeout, interval=0.25, what=f"{selector!r} to show {text!r}")


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
