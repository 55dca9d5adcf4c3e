"""Workflow code that misbehaves, run by real in-process workers on Postgres:
steps that overrun their timeout, retries that would pass the deadline,
effects whose transport fails, values too large to store, and the database
failing under a delivery. Each test was written to fail first (issue 10)."""

from __future__ import annotations

import asyncio

import pytest

from tests.hardening import flows
from tests.support.admission import admit
from tests.support.clocks import fast_forward_timer
from tests.support.history import events_of, step_rows
from tests.support.waiting import wait_event, wait_status, wait_until

# ----------------------------------------------------------- step timeouts


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_step_that_overruns_its_timeout_raises_step_timeout_into_the_retry_policy(
    store, pool, workers, mode
):
    await workers.start()
    eid = await admit(store, "hard-step-timeout", f"st-{mode}", {"mode": mode, "attempts": 2})

    record = await wait_status(store, eid, "completed", timeout=10)

    # Two attempts, each cut at the workflow's step_timeout (0.3 s), then
    # the step failed with StepTimeout and the workflow caught StepFailed.
    assert record["outcome"]["result"]["error"] == "StepFailed"
    assert "StepTimeout" in record["outcome"]["result"]["message"]
    steps = await step_rows(pool, eid)
    assert steps["slow"]["status"] == "failed" and steps["slow"]["attempts"] == 2
    assert steps["slow"]["error"]["name"] == "StepTimeout"
    assert flows.CALLS[f"hang_{mode}"] == 2


async def test_a_per_call_timeout_overrides_the_workflow_default(store, pool, workers):
    await workers.start()
    eid = await admit(store, "hard-step-timeout", "st-call",
                      {"mode": "async", "attempts": 1, "timeout": 0.05})
    await wait_status(store, eid, "completed", timeout=10)
    steps = await step_rows(pool, eid)
    assert steps["slow"]["error"]["name"] == "StepTimeout"
    assert "0.05" in steps["slow"]["error"]["message"]


async def test_a_retry_after_a_step_timeout_can_succeed(store, workers):
    await workers.start()
    eid = await admit(store, "hard-timeout-then-ok", "st-ok")
    record = await wait_status(store, eid, "completed", timeout=10)
    assert record["outcome"] == {"result": "call 2"}


async def test_the_late_result_of_an_abandoned_sync_step_is_kept_only_as_evidence(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "hard-step-timeout", "st-late", {"mode": "sync", "attempts": 1})
    await wait_status(store, eid, "completed", timeout=10)
    flows.RELEASE.set()  # the abandoned thread returns now

    async def observed():
        return await store.history.late_observations(eid)

    late = await wait_until(observed, what="late observation of the abandoned step")
    assert late[0]["step_key"] == "slow" and late[0]["value"] == "woke"
    steps = await step_rows(pool, eid)
    assert steps["slow"]["status"] == "failed"  # never applied


# -------------------------------------------------- retries past the deadline


async def test_a_retry_that_would_start_after_the_deadline_ends_the_execution_timed_out(
    store, pool, workers
):
    await workers.start()
    eid = "retry-deadline"
    await store.admissions.admit(workflow_id="hard-retry-past-deadline", params={}, execution_id=eid,
                      timeout_seconds=3)

    record = await wait_status(store, eid, "timed_out", "failed", timeout=10)

    assert record["status"] == "timed_out", record["outcome"]
    assert record["outcome"]["error"]["name"] == "DeadlineExceeded"
    # attempts at 0, 2 s; the third would start at 4 s, past the 3 s deadline
    assert flows.CALLS["always_fails"] == 2
    step = (await step_rows(pool, eid))["doomed"]
    assert (step["status"], step["attempts"]) == ("failed", 2)


# ------------------------------------------------------------------ effects


@pytest.mark.parametrize("kind", ["connection", "timeout", "oserror"])
async def test_an_effect_that_raises_a_transport_error_is_parked_as_outcome_unknown(
    store, pool, workers, kind
):
    await workers.start()
    eid = await admit(store, "hard-effect-transport", f"fx-{kind}", {"kind": kind})

    record = await wait_status(store, eid, "parked", "completed", timeout=10)

    assert record["status"] == "parked", record
    assert record["parked_step"] == "charge"
    effect = await pool.fetchrow("SELECT status FROM effects WHERE execution_id = $1", eid)
    assert effect["status"] == "outcome_unknown"
    assert "charge" not in await step_rows(pool, eid)  # nothing guessed


@pytest.mark.parametrize("kind,opt_out", [("declined", False), ("connection", True)])
async def test_a_known_failure_and_the_opt_out_record_the_effect_as_failed(
    store, pool, workers, kind, opt_out
):
    await workers.start()
    eid = await admit(store, "hard-effect-transport", f"fx-{kind}-{opt_out}",
                      {"kind": kind, "opt_out": opt_out})
    record = await wait_status(store, eid, "completed", "parked", timeout=10)
    assert record["outcome"] == {"result": "failed: StepFailed"}
    assert (await step_rows(pool, eid))["charge"]["status"] == "failed"


# ------------------------------------------------------------ large values


async def test_a_step_result_over_the_payload_limit_fails_that_step(store, pool, workers):
    await workers.start(max_payload_bytes=1000)
    eid = await admit(store, "hard-big", "big-step", {"where": "step", "bytes": 5000})
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["outcome"]["result"]["error"] == "StepFailed"
    step = (await step_rows(pool, eid))["big"]
    assert step["status"] == "failed" and step["error"]["name"] == "StepResultTooLarge"
    assert "1000" in step["error"]["message"]


async def test_a_workflow_result_over_the_payload_limit_fails_the_execution(store, workers):
    await workers.start(max_payload_bytes=1000)
    eid = await admit(store, "hard-big", "big-result", {"where": "result", "bytes": 5000})
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["status"] == "failed"
    assert record["outcome"]["error"]["name"] == "ResultTooLarge"


async def test_a_result_within_the_limit_is_stored(store, workers):
    await workers.start(max_payload_bytes=1000)
    eid = await admit(store, "hard-big", "small-result", {"where": "result", "bytes": 100})
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["status"] == "completed"


# ------------------------------------------------- the database errs mid-way

# SQLSTATEs that mean the database failed, raised by Postgres itself from a
# trigger on the step table: every step write of the delivery meets it.
INFRASTRUCTURE_SQLSTATES = ["08006", "40001", "40P01", "53100", "53200", "57P01", "57014",
                            "58030", "25006", "55P03"]


@pytest.mark.parametrize("sqlstate", INFRASTRUCTURE_SQLSTATES)
async def test_a_database_failure_under_a_delivery_is_never_a_workflow_outcome(
    store, pool, workers, sqlstate
):
    await pool.execute(f"""
        CREATE FUNCTION fail_steps() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$;
        CREATE TRIGGER fail_steps BEFORE INSERT ON execution_steps
            FOR EACH ROW EXECUTE FUNCTION fail_steps();
    """)
    worker = await workers.start()
    eid = await admit(store, "hard-timeout-then-ok", f"db-{sqlstate}")

    # The delivery ends without an outcome (redelivered), never `failed`.
    async def redelivered():
        return len(await events_of(store, eid, "claimed")) >= 2

    await wait_until(redelivered, timeout=15, what="a second delivery")
    record = await store.history.get(eid)
    assert record["status"] not in ("failed", "completed"), record
    assert not any(t.done() for t in workers.tasks.values()), "the worker died"

    await pool.execute("DROP TRIGGER fail_steps ON execution_steps")
    record = await wait_status(store, eid, "completed", "failed", timeout=15)
    assert record["status"] == "completed", record
    assert worker.store is not None


async def test_a_transactional_step_retries_a_serialization_failure_of_its_own_sql(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "hard-tx-conflict", "tx-40001", {"fail_times": 2})
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["outcome"] == {"result": {"attempt": 3}}, record


async def test_a_transactional_step_whose_sql_keeps_conflicting_fails_the_step_bounded(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "hard-tx-conflict", "tx-40001-forever", {"fail_times": 1000})
    record = await wait_status(store, eid, "completed", "failed", timeout=15)
    assert record["status"] == "failed"
    assert record["outcome"]["error"]["name"] == "StepFailed"
    assert "SerializationError" in record["outcome"]["error"]["message"]


# ---------------------------------------------------------- worker fault paths


async def test_a_failure_between_a_claim_and_its_deliveries_does_not_strand_them(
    store, pool, workers
):
    """The step prefetch after a committed claim fails once: the claimed
    executions still run at once (no lease left to expire)."""
    worker = await workers.start()
    eid = await admit(store, "hard-sleepy", "strand-1")
    await wait_status(store, eid, "suspended", timeout=10)

    real = worker.store.history.steps
    failures = []

    async def failing_once(ids):
        if not failures:
            failures.append(ids)
            raise ConnectionResetError("injected: connection lost after the claim")
        return await real(ids)

    worker.store.history.steps = failing_once
    await fast_forward_timer(pool, eid, "nap")

    record = await wait_status(store, eid, "completed", timeout=10)
    assert failures, "the injected failure never happened"
    assert record["unacknowledged_deliveries"] == 0
    assert not await events_of(store, eid, "lease_expired")
    assert not await events_of(store, eid, "released")


async def test_a_transactional_step_longer_than_the_lease_keeps_its_lease(store, pool, workers):
    await workers.start()
    eid = await admit(store, "hard-long-tx", "long-tx", {"seconds": 2.5})  # lease is 1 s

    # While the transaction runs, the record shows a live lease throughout.
    samples = []
    while (await store.history.get(eid))["status"] not in ("completed", "failed"):
        samples.append(await pool.fetchval(
            "SELECT status <> 'running' OR lease_expires_at > now() FROM executions "
            "WHERE execution_id = $1", eid))
        await asyncio.sleep(0.1)  # sampling the lease over the step's whole 2.5 s
    assert len(samples) >= 15 and all(samples), samples
    record = await store.history.get(eid)
    assert record["status"] == "completed", record
    assert record["token"] == 1
    assert not await events_of(store, eid, "lease_expired")


async def test_renewals_are_not_starved_when_deliveries_hold_every_pool_connection(
    store, pool, workers
):
    """45 deliveries each inside a transactional step of 2.5 s (the lease is
    1 s); the worker's pool is 43 connections: every lease is still renewed."""
    await workers.start(concurrency=45)
    ids = [await admit(store, "hard-long-tx", f"busy-{i}", {"seconds": 2.5}) for i in range(45)]
    for eid in ids:
        await wait_status(store, eid, "completed", "failed", timeout=30)
    expired = await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'lease_expired'")
    tokens = await pool.fetch("SELECT DISTINCT token FROM executions")
    assert expired == 0 and [r["token"] for r in tokens] == [1]


async def test_the_acknowledgement_cannot_lose_a_race_to_the_drain_release(store, pool, workers):
    """The final acknowledgement is still in flight when the shutdown grace
    ends: the drain waits for it instead of releasing the lease under it."""
    worker = await workers.start(shutdown_grace_seconds=0.1)
    real = worker.store.leases.acknowledge
    entered = asyncio.Event()

    async def slow_acknowledge(lease, status, **kw):
        entered.set()
        await asyncio.sleep(0.5)  # the acknowledgement still in flight when the grace ends
        return await real(lease, status, **kw)

    worker.store.leases.acknowledge = slow_acknowledge
    eid = await admit(store, "hard-timeout-then-ok", "ack-drain")
    await asyncio.wait_for(entered.wait(), timeout=10)
    await workers.stop(worker)

    record = await store.history.get(eid)
    assert record["status"] == "completed", record
    assert not await events_of(store, eid, "released")


async def test_a_holder_stopped_after_a_cancel_acknowledges_even_when_its_finally_meets_the_latch(
    store, pool, workers
):
    """The step never returns; after the cancel the worker stops the delivery
    at the end of its lease. The code's `finally:` then asks for a step: the
    latch refuses it, and the worker still ends the delivery itself (a fenced
    acknowledgement), not by letting the lease lapse."""
    await workers.start()
    eid = await admit(store, "hard-hang-finally", "hang-finally")
    await wait_until(lambda: flows.CALLS.get("hang_async"), what="inside the hung step")
    await store.operator.request_cancel(eid, "test")

    [ack] = await wait_event(store, eid, "acknowledged", timeout=5)
    assert ack["detail"]["status"] == "cancelled"
    assert (await store.history.get(eid))["status"] == "cancelled"
    assert not await events_of(store, eid, "lease_expired")
    assert "cleanup" not in flows.CALLS
