"""Fixtures for the HTTP tests: the real app (create_app, its lifespan and
pool) on the per-test migrated database, driven in-process through
httpx.ASGITransport. No mocks.

  make_client        `c = await make_client(settings, workflows=None, raise_app_exceptions=True)`:
                     a client on an app built from those settings (lifespan run; closed after)
  client             app with no workflow registry (any well-formed workflowId is admitted)
  registry_client    app whose registry is tests.http.flows
  small_client       no registry, FENCEPOST_MAX_PAYLOAD_BYTES=1024
  store              ExecutionStore on the test pool (for claims / acknowledgements)
  rows               `await rows()`: (executions, execution_events, signals) row counts
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from tests.support.asgi import asgi_client


def api_settings(settings: Settings, **changes) -> Settings:
    """`settings` with no workflow modules (whatever the environment says)."""
    return settings.model_copy(update={"workflows": "", **changes})


@pytest_asyncio.fixture
async def make_client() -> AsyncIterator[Callable]:
    async with contextlib.AsyncExitStack() as stack:

        async def _make(settings: Settings, workflows=None, **kw) -> httpx.AsyncClient:
            return await stack.enter_async_context(asgi_client(settings, workflows, **kw))

        yield _make


@pytest_asyncio.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(api_settings(settings)) as c:
        yield c


@pytest_asyncio.fixture
async def registry_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    workflows = load_workflows(["tests.http.flows"])
    assert set(workflows) == {"http-test-charge", "http-test-any"}
    async with asgi_client(api_settings(settings), workflows) as c:
        yield c


@pytest_asyncio.fixture
async def small_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(api_settings(settings, max_payload_bytes=1024)) as c:
        yield c


@dataclass(frozen=True)
class Rows:
    executions: int
    events: int
    signals: int


@pytest.fixture
def rows(pool: asyncpg.Pool) -> Callable:
    async def _rows() -> Rows:
        r = await pool.fetchrow(
            """
            SELECT (SELECT count(*) FROM executions) AS executions,
                   (SELECT count(*) FROM execution_events) AS events,
                   (SELECT count(*) FROM signals) AS signals
            """
        )
        return Rows(r["executions"], r["events"], r["signals"])

    return _rows
