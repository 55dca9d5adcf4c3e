"""Schedules declared in code: @workflow(schedule=, timezone=) is checked at
import, and upserted (schedule ID = workflow ID) when a worker starts."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pydantic import BaseModel

from app.registry import WorkflowRegistrationError, workflow
from app.scheduler import Scheduler
from app.settings import Settings
from app.worker import Worker
from tests.schedules.conftest import WORKFLOWS
from tests.support.waiting import wait_until


async def noop(ctx, params):
    return None


# ------------------------------------------------------------------ registry


def test_declared_schedules_are_on_the_definition():
    nightly = WORKFLOWS["sched-test-nightly"]
    assert (nightly.schedule, nightly.timezone) == ("30 2 * * *", "Europe/Warsaw")
    minutely = WORKFLOWS["sched-test-minutely"]
    assert (minutely.schedule, minutely.timezone) == ("* * * * *", "UTC")  # UTC by default
    assert WORKFLOWS["sched-test-plain"].schedule is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "0 2 * *"}, "schedule= of 'sched-bad': expected 5 fields"),
        ({"schedule": "0 25 * * *"}, "hour: 25 is out of range 0-23"),
        ({"schedule": "0 2 * * *", "timezone": "Europe/Nowhere"}, "not a known IANA time zone"),
        ({"timezone": "Europe/Warsaw"}, "needs schedule="),
    ],
)
def test_bad_schedules_fail_at_import(kwargs, message):
    with pytest.raises(WorkflowRegistrationError) as info:
        workflow("sched-bad", **kwargs)(noop)
    assert message in str(info.value)


def test_a_scheduled_workflow_needs_params_that_accept_empty():
    class Needs(BaseModel):
        order_id: str

    with pytest.raises(WorkflowRegistrationError) as info:
        workflow("sched-bad-params", params=Needs, schedule="@daily")(noop)
    assert "params {}" in str(info.value) and "Needs" in str(info.value)


def test_a_scheduled_workflow_id_leaves_room_for_the_slot():
    with pytest.raises(WorkflowRegistrationError) as info:
        workflow("w" * 183, schedule="@daily")
    assert "182" in str(info.value)


# ---------------------------------------------------------------- the upsert


async def test_sync_upserts_code_schedules_and_keeps_their_state(store, pool):
    scheduler = Scheduler(store, WORKFLOWS)
    rows = await scheduler.sync_code_schedules()
    assert {r["schedule_id"]: (r["cron"], r["timezone"], r["source"], r["params"]) for r in rows} == {
        "sched-test-minutely": ("* * * * *", "UTC", "code", {}),
        "sched-test-nightly": ("30 2 * * *", "Europe/Warsaw", "code", {}),
    }
    # Operators paused one; time passed. A restart keeps both.
    await store.schedules.set_schedule_paused("sched-test-nightly", True)
    await pool.execute("UPDATE schedules SET last_slot = '2026-01-01T00:00Z'")
    await scheduler.sync_code_schedules()
    nightly = await store.schedules.get_schedule("sched-test-nightly")
    assert nightly["paused"] and nightly["last_slot"].isoformat() == "2026-01-01T00:00:00+00:00"
    # New code with another cron: the definition follows the code, the state stays.
    changed = dict(WORKFLOWS)
    changed["sched-test-nightly"] = dataclasses.replace(WORKFLOWS["sched-test-nightly"],
                                                        schedule="0 3 * * 1-5")
    await Scheduler(store, changed).sync_code_schedules()
    nightly = await store.schedules.get_schedule("sched-test-nightly")
    assert nightly["cron"] == "0 3 * * 1-5" and nightly["paused"]


async def test_code_no_longer_declaring_a_schedule_deletes_it(store):
    await Scheduler(store, WORKFLOWS).sync_code_schedules()
    unscheduled = dict(WORKFLOWS)
    unscheduled["sched-test-minutely"] = dataclasses.replace(
        WORKFLOWS["sched-test-minutely"], schedule=None, timezone=None)
    await Scheduler(store, unscheduled).sync_code_schedules()
    assert await store.schedules.get_schedule("sched-test-minutely") is None
    assert await store.schedules.get_schedule("sched-test-nightly") is not None


async def test_api_schedules_of_other_ids_are_left_alone(store, make_schedule):
    await make_schedule("plain-hourly", "0 * * * *", workflow_id="sched-test-plain")
    await Scheduler(store, WORKFLOWS).sync_code_schedules()
    row = await store.schedules.get_schedule("plain-hourly")
    assert row["source"] == "api" and row["cron"] == "0 * * * *"


# ---------------------------------------------------------- a real worker


async def test_a_worker_upserts_code_schedules_on_start_and_fires_them(
        database_url, store, pool, set_last_slot):
    settings = Settings(database_url=database_url, lease_seconds=2, renew_seconds=0.5,
                        poll_seconds=0.1, scheduler_interval_seconds=0.1,
                        shutdown_grace_seconds=2)
    worker = Worker(settings, WORKFLOWS, concurrency=2)
    task = asyncio.create_task(worker.run())

    def worker_alive() -> None:
        assert not task.done(), task.exception()

    # One deadline for both waits, as the worker runs throughout.
    deadline = asyncio.get_running_loop().time() + 15

    def left() -> float:
        return deadline - asyncio.get_running_loop().time()

    try:
        async def upserted():
            worker_alive()
            return await store.schedules.get_schedule("sched-test-minutely")

        await wait_until(upserted, timeout=left(), interval=0.05,
                         what="the worker to upsert its code schedules")
        assert (await store.schedules.get_schedule("sched-test-nightly"))["source"] == "code"
        # The worker was "down" for three minutes: it fires the newest slot.
        await set_last_slot("sched-test-minutely", "date_trunc('minute', now()) - "
                            "interval '3 minutes'")

        async def completed():
            worker_alive()
            return await pool.fetchrow(
                "SELECT execution_id, status, outcome FROM executions "
                "WHERE workflow_id = 'sched-test-minutely' AND status = 'completed'")

        row = await wait_until(completed, timeout=left(), interval=0.05,
                               what="the scheduled execution to complete")
        context = row["outcome"]["result"]["context"]
        assert row["execution_id"] == "sched-test-minutely~" + context["scheduledAt"][:16] + "Z"
        assert context["scheduleId"] == "sched-test-minutely"
        assert row["outcome"]["result"]["params"] == {}
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 15)
