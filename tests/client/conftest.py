"""Fixtures for the client, long-poll and idempotent-start tests (issue 14):
the real app served by a real uvicorn (own thread and loop) on the per-test
database, and real in-process workers running tests/client/flows.py.

  client_settings  `settings` with the short timings (tests/support/timing.py)
  flows            the workflows of tests/client/flows.py
  store            ExecutionStore on the test pool
  make_server      `srv = await make_server(settings=None, workflows=None, wrap=None)`
                   (served: `wrap(app)`, an ASGI wrap, if given); srv.base, srv.app (its
                   app.state.waiters once started), srv.client(); stopped after
  server           one such server with the flows registered
  workers          InProcessWorkers for the flows (`await workers.start()`); stopped after
  api_backends     `await api_backends(pg_admin, database_url)` -> {application_name: count}
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from tests.support.live_server import ServerThread, server_factory
from tests.support.timing import QUICK
from tests.support.workers import InProcessWorkers


@pytest.fixture
def client_settings(settings: Settings) -> Settings:
    return settings.model_copy(update=QUICK)


@pytest.fixture
def flows():
    return load_workflows(["tests.client.flows"])


@pytest.fixture
def store_settings(client_settings: Settings) -> Settings:
    return client_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def make_server(client_settings) -> AsyncIterator:
    async with server_factory(client_settings, name="client-test-server") as make:
        yield make


@pytest_asyncio.fixture
async def server(make_server, flows) -> ServerThread:
    return await make_server(workflows=flows)


@pytest_asyncio.fixture
async def workers(client_settings, flows) -> AsyncIterator[InProcessWorkers]:
    w = InProcessWorkers(client_settings, flows)
    yield w
    await w.stop_all()


async def api_backends(pg_admin, database_url: str) -> dict[str, int]:
    """Open connections to the test database, by application_name."""
    database = urlsplit(database_url).path.lstrip("/")
    rows = await pg_admin.fetch(
        "SELECT application_name, count(*) AS n FROM pg_stat_activity WHERE datname = $1 "
        "GROUP BY application_name", database)
    return {r["application_name"]: r["n"] for r in rows}
