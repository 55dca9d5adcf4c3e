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

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.worker import Worker
from tests.compose import flows

WORKFLOWS = load_workflows(["tests.compose.flows"])
assert WORKFLOWS and all(w.startswith("cmp-") for w in WORKFLOWS), sorted(WORKFLOWS)


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


@pytest.fixture
def cmp_settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        lease_seconds=1,
        renew_seconds=0.2,
        poll_seconds=0.2,
        redelivery_base_seconds=0.05,
        redelivery_cap_seconds=0.5,
        shutdown_grace_seconds=2,
    )


@pytest_asyncio.fixture
async def store(pool: asyncpg.Pool, cmp_settings: Settings) -> ExecutionStore:
    await pool.execute(flows.SHOP_DDL)
    return ExecutionStore.from_settings(pool, cmp_settings)


class Workers:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.tasks: dict[Worker, asyncio.Task] = {}

    async def start(self, concurrency: int = 4, **overrides) -> Worker:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        worker = Worker(settings, WORKFLOWS, concurrency=concurrency)
        self.tasks[worker] = asyncio.create_task(worker.run(), name=f"worker {worker.worker_id}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while worker.store is None:  # registered in `workers` once the store exists
            if self.tasks[worker].done():
                self.tasks[worker].result()
            assert loop.time() < deadline, "worker did not start"
            await asyncio.sleep(0.01)
        return worker

    async def stop_all(self) -> None:
        for event in flows.GATES.values():
            event.set()
        errors = []
        for worker, task in list(self.tasks.items()):
            worker.request_stop()
            try:
                await asyncio.wait_for(task, timeout=10)
            except Exception as exc:
                errors.append(exc)
        self.tasks.clear()
        if errors:
            raise errors[0]


@pytest_asyncio.fixture
async def workers(cmp_settings: Settings, store: ExecutionStore) -> AsyncIterator[Workers]:
    running = Workers(cmp_settings)
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
