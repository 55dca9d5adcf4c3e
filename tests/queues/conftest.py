"""Fixtures for the flow-control tests with real `fencepost worker`
processes: `flows`, a Harness (tests/support/harness.py) whose workers run
tests/queues/flowflows.py. Its workers are killed after the test, and their
logs printed when the test failed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.support.harness import Harness, opened, pytest_runtest_makereport  # noqa: F401


class FlowHarness(Harness):
    flows_module = "tests.queues.flowflows"
    worker_prefix = "flow-worker"


@pytest_asyncio.fixture
async def flows(database_url, request, tmp_path) -> AsyncIterator[Harness]:
    async with opened(FlowHarness(database_url, tmp_path), request) as h:
        yield h
