"""Fixtures for the compose tests (transactional steps, child workflows).

Each test gets a fresh migrated database (tests/conftest.py) with the
application's own schema `shop` created in it (flows.SHOP_DDL).

  cmp_settings  Settings with lease 1 s, renewal 0.2 s, poll 0.2 s,
                redelivery 0.05 s .. 0.5 s, shutdown grace 2 s
  store         ExecutionStore on the test pool with those settings
  workers       `await workers.start(concurrency=N, **setting_overrides)` runs an
                in-process Worker task on WORKFLOWS; all are stopped after the test
  api           an httpx client on the real app (create_app, lifespan run)
  WORKFLOWS     the `cmp-*` workflows of tests/compose/flows.py
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.compose import flows
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.compose.flows"])
assert WORKFLOWS and all(w.startswith("cmp-") for w in WORKFLOWS), sorted(WORKFLOWS)


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


def _open_gates() -> None:
    for event in flows.GATES.values():
        event.set()


@pytest.fixture
def cmp_settings(database_url: str) -> Settings:
    return quick_settings(database_url)


@pytest.fixture
def store_settings(cmp_settings: Settings) -> Settings:
    return cmp_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def store(store: ExecutionStore, pool: asyncpg.Pool) -> ExecutionStore:
    await pool.execute(flows.SHOP_DDL)  # the shop tables the workflows under test write
    return store


@pytest_asyncio.fixture
async def workers(cmp_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    running = InProcessWorkers(cmp_settings, WORKFLOWS, before_stop=_open_gates)
    try:
        yield running
    finally:
        await running.stop_all()


@pytest_asyncio.fixture
async def api(cmp_settings: Settings, store: ExecutionStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(cmp_settings.model_copy(update={"workflows": "", "auth": "disabled"}),
                     workflows=WORKFLOWS)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fencepost.test",
                                     timeout=30) as client:
            yield client
