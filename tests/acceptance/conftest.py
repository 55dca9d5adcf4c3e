"""Fixtures for the acceptance tests: `harness` (a Harness on this test's
database) and `make_harness(url)` (one on any database, e.g. an embedded
server the test restarts). Worker processes are killed after the test (SIGCONT
first, so stopped ones die too); when the test failed, every worker log is
printed (pytest shows it under "Captured stdout teardown")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from tests.acceptance.harness import Harness


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"_acc_report_{report.when}", report)
    return report


@pytest_asyncio.fixture
async def make_harness(request, tmp_path) -> AsyncIterator[Callable]:
    made: list[Harness] = []

    async def make(url: str) -> Harness:
        h = Harness(url, tmp_path / f"h{len(made)}")
        made.append(h)
        return await h.open()

    try:
        yield make
    finally:
        for h in made:
            await h.close()
        report = getattr(request.node, "_acc_report_call", None)
        if report is None or report.failed:
            for h in made:
                print(h.logs())


@pytest_asyncio.fixture
async def harness(database_url, make_harness) -> AsyncIterator[Harness]:
    h = await make_harness(database_url)
    try:
        yield h
    finally:
        await h.close()  # before database_url drops the database under the workers
