"""Fixtures for the authentication tests: the real app with
FENCEPOST_AUTH=enabled (tests/conftest.py disables auth for every other
suite), driven in-process through httpx.ASGITransport on the per-test
migrated database.

  auth_settings  `settings` with auth enabled and no workflow registry
  store          ExecutionStore on the test pool
  make_token     `token = await make_token("trigger", "alice")`: created the way
                 `fencepost tokens create` creates one (new_token + create_token)
  make_api       `api = await make_api(settings=None)`: a client on a fresh
                 create_app(...) with its lifespan running (fresh token cache)
  api            one such client on auth_settings
  headers        `headers(token)` -> {"Authorization": "Bearer <token>"}
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.api.auth import new_token
from app.settings import Settings
from app.store import ExecutionStore

BASE_URL = "http://fencepost.test"


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def auth_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth": "enabled", "workflows": ""})


@pytest.fixture
def store(pool: asyncpg.Pool, auth_settings: Settings) -> ExecutionStore:
    return ExecutionStore.from_settings(pool, auth_settings)


@pytest.fixture
def make_token(store: ExecutionStore) -> Callable:
    async def _make(role: str, name: str) -> str:
        token_id, token, digest = new_token()
        await store.create_token(token_id, name=name, role=role, secret_sha256=digest)
        return token

    return _make


@contextlib.asynccontextmanager
async def app_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, workflows=None)
    async with app.router.lifespan_context(app):
        # raise_app_exceptions=False: an unhandled exception is the 500 a real server sends.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=30) as c:
            c.app = app  # type: ignore[attr-defined]
            yield c


@pytest_asyncio.fixture
async def make_api(auth_settings: Settings) -> AsyncIterator[Callable]:
    async with contextlib.AsyncExitStack() as stack:

        async def _make(settings: Settings | None = None) -> httpx.AsyncClient:
            return await stack.enter_async_context(app_client(settings or auth_settings))

        yield _make


@pytest_asyncio.fixture
async def api(make_api: Callable) -> httpx.AsyncClient:
    return await make_api()
