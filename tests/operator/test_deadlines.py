"""Deadlines (issue 4, Build 4), with time moved by UPDATE, never by sleeping."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from app.reaper import LeaseReaper
from app.store import ExecutionStore
from tests.operator import flows
from tests.support.admission import admit, admit_api
from tests.support.history import event_count, events_of
from tests.support.responses import assert_error, get_record
from tests.support.waiting import wait_status

pytestmark = pytest.mark.timeout(60)


async def past_deadline(pool: asyncpg.Pool, eid: str) -> None:
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)


async def test_timed_out_while_suspended_by_the_reaper_sweep(
        store: ExecutionStore, pool: asyncpg.Pool, workers, api: httpx.AsyncClient) -> None:
    worker = await workers.start()
    eid = await admit(store, "op-sleep", "deadline-suspended", {"seconds": 60},
                      timeout_seconds=3600)
    await wait_status(store, eid, "suspended")
    await workers.stop(worker)  # the sweep below is the only actor

    await past_deadline(pool, eid)
    assert await store.leases.claim_due(10, 30, "w") == []  # past its deadline: nobody claims it
    await LeaseReaper(store).run_once()

    rec = await get_record(api, eid)
    assert rec["status"] == "timed_out" and rec["blockedBy"] is None, rec
    assert rec["outcome"]["error"]["name"] == "DeadlineExceeded", rec
    assert rec["dueAt"] is None
    assert [e["kind"] for e in await store.history.events(eid)][-1] == "timed_out"
    assert (eid, "after") not in flows.CALLS


async def test_timed_out_while_leased_at_the_holders_next_fenced_write(
        store: ExecutionStore, pool: asyncpg.Pool, workers) -> None:
    await workers.start()
    eid = await admit(store, "op-gated", "deadline-leased", timeout_seconds=3600)
    await asyncio.wait_for(flows.STARTED[eid].wait(), 10)
    await past_deadline(pool, eid)
    assert (await store.history.get(eid))["status"] == "running"  # the holder decides, at its next write

    flows.GATES[eid].set()
    rec = await wait_status(store, eid, "timed_out")
    assert rec["outcome"]["error"]["name"] == "DeadlineExceeded", rec
    steps = (await store.history.steps([eid]))[eid]
    assert sorted(steps) == ["cleanup-deadline", "finally", "slow"], steps  # never "after"
    assert (eid, "after") not in flows.CALLS
    [ack] = await events_of(store, eid, "acknowledged")
    assert (ack["token"], ack["detail"]["status"]) == (1, "timed_out"), ack
    assert [e["kind"] for e in await store.history.events(eid)][-1] == "timed_out"


async def test_a_step_retry_is_not_scheduled_past_the_deadline(
        store: ExecutionStore, workers) -> None:
    await workers.start()
    started = time.monotonic()
    # The retry policy would wait 30 s; the deadline is 5 s ahead.
    eid = await admit(store, "op-retry-long", "deadline-retry", timeout_seconds=5)
    rec = await wait_status(store, eid, "failed", "timed_out", timeout=10)
    elapsed = time.monotonic() - started
    assert elapsed < 3, f"waited {elapsed:.1f}s: the retry was scheduled"
    assert flows.CALLS.count((eid, "flaky")) == 1, flows.CALLS
    # The one right answer: the last attempt's failure stands recorded, and
    # the execution is timed out (not failed): no retry past the deadline.
    step = (await store.history.steps([eid]))[eid]["flaky"]
    assert (step.status, step.attempts) == ("failed", 1), step
    assert step.error["name"] == "Declined", step
    assert rec["status"] == "timed_out", rec
    assert rec["outcome"]["error"]["name"] == "DeadlineExceeded", rec


async def test_a_sleep_ending_after_the_deadline_wakes_at_the_deadline_and_times_out(
        store: ExecutionStore, workers) -> None:
    await workers.start()
    eid = await admit(store, "op-sleep", "deadline-sleep", {"seconds": 60}, timeout_seconds=2)
    await wait_status(store, eid, "suspended")
    assert await store.history.get(eid) and (await store.history.get(eid))["due_at"] == \
        (await store.history.get(eid))["deadline"]  # the wake is at the deadline, not at 60 s
    rec = await wait_status(store, eid, "timed_out", timeout=10)
    assert rec["outcome"]["error"]["name"] == "DeadlineExceeded", rec
    acks = [e["detail"]["status"] for e in await events_of(store, eid, "acknowledged")]
    assert acks == ["suspended", "timed_out"], acks
    [ended] = await events_of(store, eid, "timed_out")
    assert ended["at"] >= rec["deadline"]  # not before the deadline
    assert (eid, "after") not in flows.CALLS


async def test_a_redelivery_that_would_start_after_the_deadline_is_not_scheduled(
        pool: asyncpg.Pool, op_settings) -> None:
    store = ExecutionStore(pool, redelivery_base_seconds=60, redelivery_cap_seconds=60)
    eid = await admit(store, "op-quick", "deadline-redelivery", timeout_seconds=30)
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.leases.release(d.lease)  # redelivery in 60 s, after the deadline
    rec = await store.history.get(eid)
    assert rec["status"] == "timed_out", rec
    assert [e["kind"] for e in await store.history.events(eid)][-2:] == ["released", "timed_out"]


async def test_deadline_and_timeout_seconds_at_admission(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    before = await event_count(store)
    r = await admit_api(api, "op-quick", "adm-both", deadline="2099-01-01T00:00:00Z",
                        timeoutSeconds=10)
    assert_error(r, 422, "INVALID_REQUEST")
    r = await admit_api(api, "op-quick", "adm-naive", deadline="2099-01-01T00:00:00")
    assert_error(r, 422, "INVALID_REQUEST")
    for bad in (0, -5, "soon"):
        assert (await admit_api(api, "op-quick", "adm-bad", timeoutSeconds=bad)).status_code == 422
    assert await event_count(store) == before
    for eid in ("adm-both", "adm-naive", "adm-bad"):
        assert (await api.get(f"/v1/executions/{eid}")).status_code == 404

    def at(value: str) -> datetime:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    r = await admit_api(api, "op-quick", "adm-deadline", deadline="2099-01-01T01:00:00+01:00")
    assert r.status_code == 201, r.text
    assert at((await get_record(api, "adm-deadline"))["deadline"]) == datetime(2099, 1, 1, tzinfo=UTC)

    r = await admit_api(api, "op-quick", "adm-timeout", timeoutSeconds=120)
    assert r.status_code == 201, r.text
    rec = await get_record(api, "adm-timeout")
    assert at(rec["deadline"]) - at(rec["admittedAt"]) == timedelta(seconds=120), rec

    r = await admit_api(api, "op-quick", "adm-none")
    assert r.status_code == 201 and (await get_record(api, "adm-none"))["deadline"] is None

    # The workflow's default (5 minutes) applies when none is given...
    r = await admit_api(api, "op-default-timeout", "adm-default")
    assert r.status_code == 201, r.text
    rec = await get_record(api, "adm-default")
    assert at(rec["deadline"]) - at(rec["admittedAt"]) == timedelta(minutes=5), rec
    # ...and either form given at admission overrides it.
    await admit_api(api, "op-default-timeout", "adm-default-timeout", timeoutSeconds=10)
    rec = await get_record(api, "adm-default-timeout")
    assert at(rec["deadline"]) - at(rec["admittedAt"]) == timedelta(seconds=10), rec
    await admit_api(api, "op-default-timeout", "adm-default-deadline",
                    deadline="2099-06-01T00:00:00Z")
    rec = await get_record(api, "adm-default-deadline")
    assert at(rec["deadline"]) == datetime(2099, 6, 1, tzinfo=UTC), rec


async def test_timed_out_while_parked(store: ExecutionStore, pool: asyncpg.Pool) -> None:
    eid = await admit(store, "op-charge", "deadline-parked", {"recovery": "neither"},
                      timeout_seconds=3600)
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.effects.begin_effect(d.lease, "charge", idempotency_key="k", function_name="f")
    await store.effects.park_outcome_unknown(d.lease, "charge")
    assert await store.leases.sweep_interrupted() == []
    await past_deadline(pool, eid)
    assert await store.leases.sweep_interrupted() == [eid]
    rec = await store.history.get(eid)
    assert (rec["status"], rec["parked_reason"], rec["parked_step"]) == ("timed_out", None, None)
    assert [e["kind"] for e in await store.history.events(eid)][-1] == "timed_out"
