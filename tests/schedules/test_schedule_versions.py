"""Schedule firings record the code version of the workflow in the firing
worker's code, and route by it: a worker carrying another version never
claims the firing; one carrying that version runs it. An unversioned
workflow's firings are run by any worker carrying it.

Slots are made due by moving the schedule's last_slot back (never by
sleeping); the firing is one Scheduler pass; workers run in-process, each
with its own registry."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest_asyncio

from app.registry import WorkflowDefinition, load_workflows
from app.scheduler import Scheduler
from app.worker import Worker
from tests.support.history import events_of
from tests.support.timing import quick_settings
from tests.support.waiting import wait_status, wait_until
from tests.support.workers import InProcessWorkers

DEFINED = load_workflows(["tests.schedules.versionflows"])
REPORT = "ver-sched-report"


def code(version: str | None) -> dict[str, WorkflowDefinition]:
    """A worker's registry carrying ver-sched-report at `version`."""
    return {REPORT: dataclasses.replace(DEFINED[REPORT], version=version)}


@pytest_asyncio.fixture
async def running(database_url, store) -> AsyncIterator[InProcessWorkers]:
    workers = InProcessWorkers(quick_settings(database_url), {})
    try:
        yield workers
    finally:
        await workers.stop_all()


async def fire_once(store, make_schedule, set_last_slot, version: str | None) -> str:
    """One slot of a minutely schedule of ver-sched-report fired by a
    scheduler whose code carries `version`; the slot's execution ID."""
    await make_schedule("every-minute", "* * * * *", workflow_id=REPORT)
    await set_last_slot("every-minute", "date_trunc('minute', now()) - interval '1 minute'")
    fired = await Scheduler(store, code(version)).run_once()
    assert len(fired.admitted) == 1, fired
    return fired.admitted[0]


async def claimers(store, execution_id: str) -> list[str]:
    return [e["detail"]["owner"] for e in await events_of(store, execution_id, "claimed")]


async def more_rounds(workers: InProcessWorkers, worker: Worker, n: int = 3) -> None:
    start = workers.rounds[worker]
    await wait_until(lambda: workers.rounds[worker] >= start + n, timeout=10,
                     what=f"{n} more claim rounds of {worker.worker_id}")


async def test_a_firing_records_the_version_and_only_that_version_runs_it(
        store, make_schedule, set_last_slot, running):
    v1 = await running.start(workflows=code("1"))
    slot = await fire_once(store, make_schedule, set_last_slot, "2")

    record = await store.history.get(slot)
    assert (record["workflow_id"], record["code_version"]) == (REPORT, "2")
    await more_rounds(running, v1)
    assert await store.history.get(slot) is not None
    assert (await store.history.get(slot))["status"] == "admitted"
    assert await claimers(store, slot) == []

    v2 = await running.start(workflows=code("2"))
    record = await wait_status(store, slot, "completed")
    assert record["outcome"]["result"]["scheduledAt"] == record["context"]["scheduledAt"]
    assert await claimers(store, slot) == [v2.worker_id]


async def test_an_unversioned_workflows_firing_is_run_by_any_worker_carrying_it(
        store, make_schedule, set_last_slot, running):
    slot = await fire_once(store, make_schedule, set_last_slot, None)
    assert (await store.history.get(slot))["code_version"] is None

    v1 = await running.start(workflows=code("1"))
    await wait_status(store, slot, "completed")
    assert await claimers(store, slot) == [v1.worker_id]
