"""The API in-process: `create_app` with its lifespan running, and an httpx
client on it through ASGITransport (no socket). raise_app_exceptions=False
turns an unhandled exception into the 500 a real server would send."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx

from app.api.app import create_app
from app.settings import Settings


@contextlib.asynccontextmanager
async def asgi_client(settings: Settings, workflows=None, *,
                      raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, workflows=workflows)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://fencepost.test",
                                     timeout=30) as client:
            client.app = app  # type: ignore[attr-defined]  # for tests that read its state
            yield client
