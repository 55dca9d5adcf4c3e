"""Fixtures for the in-process SDK and worker tests.

Each test gets a fresh migrated database (tests/conftest.py) and runs real
`Worker(...).run()` coroutines as asyncio tasks in the test's event loop, with
short leases and polls so nothing waits long:

  sdk_settings  Settings with lease 1 s, renewal 0.2 s, poll 0.2 s,
                redelivery 0.05 s .. 0.5 s, shutdown grace 2 s
  store         ExecutionStore on the test pool with those settings
  workers       `await workers.start(concurrency=N, **setting_overrides)` starts
                a Worker task; `await workers.stop(w)` stops one (request_stop +
                await); every worker still running is stopped after the test
  WORKFLOWS     the `sdk-*` workflows of tests/sdk/flows.py
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.sdk import flows
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.sdk.flows"])
assert WORKFLOWS and all(w.startswith("sdk-") for w in WORKFLOWS), sorted(WORKFLOWS)


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


@pytest.fixture
def sdk_settings(database_url: str) -> Settings:
    return quick_settings(database_url)


@pytest.fixture
def store_settings(sdk_settings: Settings) -> Settings:
    return sdk_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture
def store(store: ExecutionStore) -> ExecutionStore:
    flows.STORE["store"] = store  # the workflows under test read the store from here
    return store


@pytest_asyncio.fixture
async def workers(sdk_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    # Depends on `store` so workers stop before the test pool closes.
    pool_of_workers = InProcessWorkers(sdk_settings, WORKFLOWS)
    try:
        yield pool_of_workers
    finally:
        # Open every gate first, so deliveries still waiting end promptly.
        for event in flows.GATES.values():
            event.set()
        for event in flows.THREAD_GATES.values():
            event.set()
        await pool_of_workers.stop_all()
