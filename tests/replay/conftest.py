"""Fixtures for the replay check's tests: histories recorded by real
in-process workers (tests/support/workers.py) on the per-test database, then
replayed against changed code with every step function armed to fail.

  store      ExecutionStore with the short timings
  workers    InProcessWorkers running tests/replay/flows.py
  recorded   `history = await recorded(eid, code=variants.recorded, n=1)`:
             admits rp-order, runs it on a worker carrying `code` until it
             sleeps on `nap` (reserve, charge, book, kid, kid-done, nap
             recorded), stops the worker, returns the exported history
             and arms the step functions: from then on a call fails the test
  armed      the step functions called while armed (none, or the test failed)
  definition `definition(code)`: rp-order's definition with `code` as its function
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from app.registry import WorkflowDefinition, load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.replay import steps, variants
from tests.support.admission import admit
from tests.support.timing import quick_settings
from tests.support.waiting import wait_until
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.replay.flows"])
assert sorted(WORKFLOWS) == ["rp-child", "rp-gather", "rp-order", "rp-short", "rp-signal"], sorted(WORKFLOWS)


def definition(code: Callable) -> WorkflowDefinition:
    return dataclasses.replace(WORKFLOWS["rp-order"], fn=code)


@pytest.fixture
def replay_settings(database_url: str) -> Settings:
    return quick_settings(database_url)


@pytest.fixture
def store_settings(replay_settings: Settings) -> Settings:
    return replay_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    steps.ARMED["mode"] = None
    steps.CALLED.clear()
    yield
    steps.ARMED["mode"] = None


@pytest.fixture
def armed() -> list[str]:
    return steps.CALLED


@pytest_asyncio.fixture
async def workers(replay_settings: Settings, store: ExecutionStore
                  ) -> AsyncIterator[InProcessWorkers]:
    pool_of_workers = InProcessWorkers(replay_settings, WORKFLOWS)
    try:
        yield pool_of_workers
    finally:
        await pool_of_workers.stop_all()


async def sleeping_on_nap(store: ExecutionStore, execution_id: str) -> bool:
    record = await store.history.get(execution_id)
    assert record is not None
    assert record["status"] not in ("failed", "parked"), record
    return record["status"] == "suspended" and (record["waiting_on"] or {}).get("sleep") == "nap"


@pytest.fixture
def recorded(store: ExecutionStore, workers: InProcessWorkers) -> Callable:
    async def run(execution_id: str, code: Callable = variants.recorded, n: int = 1) -> dict:
        steps.ARMED["mode"] = None
        worker = await workers.start(workflows={**WORKFLOWS, "rp-order": definition(code)})
        await admit(store, "rp-order", execution_id, {"n": n})
        await wait_until(lambda: sleeping_on_nap(store, execution_id), timeout=20,
                         what=f"{execution_id} sleeps on nap")
        await workers.stop(worker)
        history = await store.exports.export(execution_id)
        assert history is not None
        steps.ARMED["mode"] = "test"  # whatever replays it now must run no step
        return history

    return run
