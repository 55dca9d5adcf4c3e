"""Fixtures for the operator tests (issue 4: effects, cancellation, deadlines,
poison, blockedBy, resolve/resume, history).

  op_settings  Settings with short timings: lease 1 s, renewal 0.2 s, poll 0.2 s,
               redelivery 0.05 s .. 0.2 s, shutdown grace 1 s (API auth disabled)
  store        ExecutionStore on the test pool with those settings
  api          httpx client on create_app(op_settings, workflows of
               tests.operator.flows), lifespan running, in-process (ASGITransport)
  workers      `await workers.start(**setting_overrides)`: an in-process Worker task
  procs        real `fencepost worker` processes (tests/operator/procs.py); the
               fake remote's side tables exist; logs printed when a test fails
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.operator import flows
from tests.operator.procs import Procs
from tests.support.asgi import asgi_client
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.operator.flows"])
assert WORKFLOWS and all(w.startswith("op-") for w in WORKFLOWS), sorted(WORKFLOWS)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"_op_report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


# The API's bearer-token authentication, where the tree has it, is another
# suite's subject: these tests act as the anonymous operator.
_NO_AUTH = {"auth": "disabled"} if "auth" in Settings.model_fields else {}


def _open_gates() -> None:
    for event in flows.GATES.values():
        event.set()


@pytest.fixture
def op_settings(database_url: str) -> Settings:
    return quick_settings(database_url, **_NO_AUTH, redelivery_cap_seconds=0.2,
                          shutdown_grace_seconds=1, workflows="")


@pytest.fixture
def store_settings(op_settings: Settings) -> Settings:
    return op_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def api(op_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(op_settings, WORKFLOWS) as client:
        yield client


@pytest_asyncio.fixture
async def workers(op_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    # Depends on `store` (the pool) so the workers stop before the pool closes.
    w = InProcessWorkers(op_settings, WORKFLOWS, default_concurrency=8, before_stop=_open_gates)
    try:
        yield w
    finally:
        await w.stop_all()


@pytest_asyncio.fixture
async def procs(request, database_url: str, pool: asyncpg.Pool, tmp_path) -> AsyncIterator[Procs]:
    await pool.execute(flows.REMOTE_DDL)
    p = Procs(database_url, tmp_path / "logs", pool)
    try:
        yield p
    finally:
        p.kill_all()  # before database_url drops the database under them
        report = getattr(request.node, "_op_report_call", None)
        if report is None or report.failed:
            print(p.logs())
