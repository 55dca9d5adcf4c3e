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

import httpx
import pytest
import pytest_asyncio

from app.api.auth import new_token
from app.settings import Settings
from app.store import ExecutionStore
from tests.support.asgi import asgi_client


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def auth_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth": "enabled", "workflows": ""})


@pytest.fixture
def store_settings(auth_settings: Settings) -> Settings:
    return auth_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture
def make_token(store: ExecutionStore) -> Callable:
    async def _make(role: str, name: str) -> str:
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=name, role=role, secret_sha256=digest)
        return token

    return _make


@pytest_asyncio.fixture
async def make_api(auth_settings: Settings) -> AsyncIterator[Callable]:
    async with contextlib.AsyncExitStack() as stack:

        async def _make(settings: Settings | None = None) -> httpx.AsyncClient:
            return await stack.enter_async_context(
                asgi_client(settings or auth_settings, raise_app_exceptions=False))

        yield _make


@pytest_asyncio.fixture
async def api(make_api: Callable) -> httpx.AsyncClient:
    return await make_api()
