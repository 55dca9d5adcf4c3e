"""The claim loop of a worker whose slots are all taken, against real
Postgres (in-process `Worker(...).run()` tasks with the SDK test workflows).

A full worker cannot claim, so it waits for a freed slot (or a NOTIFY, or
the poll interval): a due time its last claim told of, once past, must not
make it pass its loop again and again (a wait of a millisecond on a time
already past, every millisecond)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.sdk import flows
from tests.support.admission import admit
from tests.support.timing import quick_settings
from tests.support.waiting import wait_status, wait_until
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.sdk.flows"])
POLL_SECONDS = 5.0


@pytest.fixture(autouse=True)
def _reset_flows() -> None:
    flows.reset()


@pytest.fixture
def store_settings(database_url: str) -> Settings:
    return quick_settings(database_url)  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def workers(store_settings: Settings,
                  store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    # Depends on `store` so workers stop before the test pool closes.
    flows.STORE["store"] = store
    running = InProcessWorkers(store_settings, WORKFLOWS)
    try:
        yield running
    finally:
        for event in flows.GATES.values():
            event.set()
        await running.stop_all()


async def test_a_full_worker_waits_for_a_freed_slot_not_for_a_due_time_already_past(
        store: ExecutionStore, workers: InProcessWorkers) -> None:
    busy = await admit(store, "sdk-gated", "busy")
    later = await admit(store, "sdk-return", "later", delay_seconds=0.5)
    worker = await workers.start(concurrency=1, poll_seconds=POLL_SECONDS)
    # Its one slot taken by `busy`; its claim told of `later`, due in 0.5 s.
    await wait_until(lambda: flows.calls(busy, "slow:start") == 1, timeout=10, what="busy runs")
    waits: list[float] = []
    sleep = worker._sleep

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await sleep(seconds)

    worker._sleep = recorded  # type: ignore[method-assign]
    # Past `later`'s due time, with the slot still taken: a loop woken by
    # that past due time would pass here about once a millisecond.
    await asyncio.sleep(2.0)
    while_full = list(waits)
    flows.gate(busy).set()

    assert len(while_full) <= 5, f"{len(while_full)} claimer passes in 2 s with no free slot"
    # Every wait begun while the slot was taken is for a freed slot, a
    # NOTIFY or the poll interval, never for a due time it cannot claim.
    assert all(seconds == POLL_SECONDS for seconds in while_full), while_full
    # The freed slot wakes it: `later` runs then, not at the next poll.
    await wait_status(store, busy, "completed", timeout=10)
    await wait_status(store, later, "completed", timeout=POLL_SECONDS - 1)
