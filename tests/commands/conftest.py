"""Fixtures for the operator commands' tests: the commands called directly
against a real Postgres, and the API and dashboard calling them.

  store      ExecutionStore on the test pool (tests/operator's quick settings)
  api        httpx client on create_app (auth disabled), lifespan running
             with the dashboard's CSRF cookie (`form()`: the field it derives)
  workers    `await workers.start()`: an in-process Worker running tests/commands/flows.py
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.ui.routes import CSRF_COOKIE, _csrf_of
from tests.support.asgi import asgi_client
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.commands.flows"])
CSRF_SEED = "c" * 40


@pytest.fixture
def c_settings(database_url: str) -> Settings:
    return quick_settings(database_url, auth="disabled", workflows="")


@pytest.fixture
def store_settings(c_settings: Settings) -> Settings:
    return c_settings


@pytest_asyncio.fixture
async def api(c_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(c_settings, WORKFLOWS) as client:
        client.cookies.set(CSRF_COOKIE, CSRF_SEED)
        yield client


@pytest_asyncio.fixture
async def workers(c_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    # Depends on `store` (the pool) so the workers stop before the pool closes.
    w = InProcessWorkers(c_settings, WORKFLOWS)
    try:
        yield w
    finally:
        await w.stop_all()


def form(**fields: str) -> dict[str, str]:
    """A dashboard form with the CSRF field its cookie derives."""
    return {"csrf": _csrf_of(CSRF_SEED), **fields}
