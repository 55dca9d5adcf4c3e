"""Fixtures for the tests of real `fencepost worker` processes: `harness` (a
Harness on this test's database) and `make_harness(url)` (one on any database,
e.g. an embedded server the test restarts), both from tests/support/harness.py.
Worker processes are killed after the test (SIGCONT first, so stopped ones die
too); when the test failed, every worker log is printed (pytest shows it under
"Captured stdout teardown")."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.support.harness import Harness, make_harness, pytest_runtest_makereport  # noqa: F401


@pytest_asyncio.fixture
async def harness(database_url, make_harness) -> AsyncIterator[Harness]:  # noqa: F811 - the fixture
    h = await make_harness(database_url)
    try:
        yield h
    finally:
        await h.close()  # before database_url drops the database under the workers
