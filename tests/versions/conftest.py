"""Fixtures for the version-move tests: short timings, the store, the API
in-process carrying the code a test names (`api_for(workflows)`), and
in-process workers carrying the code each is started with.

  api        the API carrying version 2's code (the new deploy)
  api_for    `async with api_for(V3) as client:` the API carrying other code
  workers    InProcessWorkers; `await workers.start(workflows=V2)`
  suspended  `await suspended(eid)`: admitted under version 1 and run by a
             version 1 worker until it waits for the signal `go` (the
             worker is stopped again: nothing claims it afterwards)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from app.settings import Settings
from app.store import ExecutionStore
from tests.support.asgi import asgi_client
from tests.support.timing import quick_settings
from tests.support.waiting import wait_record
from tests.support.workers import InProcessWorkers
from tests.versions import flows


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


@pytest.fixture
def vm_settings(database_url: str) -> Settings:
    return quick_settings(database_url, auth="disabled", workflows="")


@pytest.fixture
def store_settings(vm_settings: Settings) -> Settings:
    return vm_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture
def api_for(vm_settings: Settings):
    @contextlib.asynccontextmanager
    async def serve(workflows) -> AsyncIterator[httpx.AsyncClient]:
        async with asgi_client(vm_settings, workflows) as client:
            yield client

    return serve


@pytest_asyncio.fixture
async def api(api_for) -> AsyncIterator[httpx.AsyncClient]:
    async with api_for(flows.V2) as client:
        yield client


@pytest_asyncio.fixture
async def workers(vm_settings: Settings, store: ExecutionStore
                  ) -> AsyncIterator[InProcessWorkers]:
    group = InProcessWorkers(vm_settings, flows.V1)
    try:
        yield group
    finally:
        await group.stop_all()


async def admit(store: ExecutionStore, eid: str, version: str | None = "1") -> None:
    await store.admissions.admit(workflow_id="vm-order", params={}, execution_id=eid,
                                code_version=version)


def waiting_for_go(record: dict) -> bool:
    return record["status"] == "suspended" and record["waiting_on"] is not None


@pytest.fixture
def suspended(store: ExecutionStore, workers: InProcessWorkers):
    async def run(*eids: str, version: str = "1") -> None:
        for eid in eids:
            await admit(store, eid, version)
        worker = await workers.start(workflows=flows.deploy(version))
        for eid in eids:
            await wait_record(store, eid, waiting_for_go, what=f"{eid} waits for go")
        await workers.stop(worker)

    return run
