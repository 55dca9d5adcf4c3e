"""Fixtures for the redrive and fork tests: short timings, the store, an
in-process API (authentication disabled) and in-process workers running
tests/redrive/flows.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.redrive import flows
from tests.support.asgi import asgi_client
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.redrive.flows"])


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


@pytest.fixture
def rd_settings(database_url: str) -> Settings:
    return quick_settings(database_url, auth="disabled", workflows="")


@pytest.fixture
def store_settings(rd_settings: Settings) -> Settings:
    return rd_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def api(rd_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(rd_settings, WORKFLOWS) as client:
        yield client


@pytest_asyncio.fixture
async def workers(rd_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    group = InProcessWorkers(rd_settings, WORKFLOWS)
    try:
        yield group
    finally:
        await group.stop_all()

# The harness report hook: a failing test shows its workers' logs.
from tests.support.harness import pytest_runtest_makereport  # noqa: E402, F401
