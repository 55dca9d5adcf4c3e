"""Fixtures for the hardening tests: workflow code that hangs, swallows
errors or outlives its lease, run by in-process workers (`workers`) and by
real `fencepost worker` processes (`harness`, see tests/support/harness.py).

  hard_settings  lease 1 s, renewal 0.2 s, poll 0.2 s, redelivery 0.05..0.5 s
  store          ExecutionStore on the test pool
  workers        in-process workers running tests/hardening/flows.py
  harness        real worker processes running the same module
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.hardening import flows
from tests.support.harness import Harness, make_harness, opened, pytest_runtest_makereport  # noqa: F401
from tests.support.timing import quick_settings
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.hardening.flows"])


class HardeningHarness(Harness):
    flows_module = "tests.hardening.flows"
    worker_prefix = "hard-worker"


@pytest.fixture(autouse=True)
def _reset_flows(tmp_path, monkeypatch) -> None:
    flows.reset()
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("ACC_MARK_DIR", str(marks))  # step marks of in-process workers


@pytest.fixture
def hard_settings(database_url: str) -> Settings:
    return quick_settings(database_url)


@pytest.fixture
def store_settings(hard_settings: Settings) -> Settings:
    return hard_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def workers(hard_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    group = InProcessWorkers(hard_settings, WORKFLOWS, before_stop=flows.RELEASE.set)
    try:
        yield group
    finally:
        flows.RELEASE.set()
        await group.stop_all()


@pytest_asyncio.fixture
async def harness(database_url, tmp_path, request) -> AsyncIterator[Harness]:
    async with opened(HardeningHarness(database_url, tmp_path / "h"), request) as h:
        yield h
