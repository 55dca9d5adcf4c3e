"""Issue 10, item 10: late observations close the loop.

`record_late_observation` compares what a stale holder observed with what
was recorded for that step (or, for an acknowledgement, with the terminal
outcome) in the statement that appends it: a difference is an integrity
conflict (late_observations.conflict = true, executions.integrity_conflicts
+ 1, an 'integrity_conflict' event); the same is conflict = false; nothing
to compare with is NULL. Nothing is ever applied to the record."""

from __future__ import annotations

import asyncpg

from app.store import Admitted, ExecutionStore, Lease


async def stale_and_current(store: ExecutionStore, clock, execution_id: str) -> tuple[Lease, Lease]:
    result = await store.admissions.admit(workflow_id="lo-wf", params={}, execution_id=execution_id)
    assert isinstance(result, Admitted), result
    [a] = await store.leases.claim_due(1, 30.0, "holder-A", ["lo-wf"])
    await clock.expire_lease(execution_id)
    [b] = await store.leases.claim_due(1, 30.0, "holder-B", ["lo-wf"])
    assert b.lease.token == a.lease.token + 1
    return a.lease, b.lease


async def observations(pool: asyncpg.Pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT observation_id, step_key, token, value, error, conflict FROM late_observations "
        "WHERE execution_id = $1 ORDER BY observation_id", execution_id)
    return [dict(r) for r in rows]


async def conflict_events(pool: asyncpg.Pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT token, detail FROM execution_events "
        "WHERE execution_id = $1 AND kind = 'integrity_conflict' ORDER BY event_id",
        execution_id)
    return [dict(r) for r in rows]


async def counter(pool: asyncpg.Pool, execution_id: str) -> int:
    return await pool.fetchval(
        "SELECT integrity_conflicts FROM executions WHERE execution_id = $1", execution_id)


async def test_a_late_result_equal_to_the_recorded_one_is_no_conflict(store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-same")
    await store.steps.write_step(current, "charge", value={"receipt": 7})

    flag = await store.steps.record_late_observation(stale, "charge", value={"receipt": 7})

    assert flag is False
    [obs] = await observations(pool, "lo-same")
    assert (obs["conflict"], obs["token"]) == (False, stale.token)
    assert await counter(pool, "lo-same") == 0
    assert await conflict_events(pool, "lo-same") == []


async def test_a_late_result_that_differs_is_an_integrity_conflict_never_applied(
        store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-diff")
    await store.steps.write_step(current, "charge", value={"receipt": 7})

    flag = await store.steps.record_late_observation(stale, "charge", value={"receipt": 8})

    assert flag is True
    [obs] = await observations(pool, "lo-diff")
    assert obs["conflict"] is True
    assert await counter(pool, "lo-diff") == 1
    events = await conflict_events(pool, "lo-diff")
    assert events == [{"token": stale.token,
                       "detail": {"stepKey": "charge", "observationId": obs["observation_id"]}}]
    step = (await store.history.steps(["lo-diff"]))["lo-diff"]["charge"]
    assert (step.value, step.token) == ({"receipt": 7}, current.token)  # untouched
    record = await store.history.get("lo-diff")
    assert (record["status"], record["token"]) == ("running", current.token)

    # A second conflicting observation counts again.
    assert await store.steps.record_late_observation(stale, "charge", error={"name": "Boom",
                                                                       "message": "x"}) is True
    assert await counter(pool, "lo-diff") == 2


async def test_errors_compare_by_name_and_nothing_recorded_is_null(store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-err")
    await store.steps.write_step(current, "call", error={"name": "Declined", "message": "at 10:01"})

    # Same failure (the message may carry times, hosts, ...): no conflict.
    assert await store.steps.record_late_observation(
        stale, "call", error={"name": "Declined", "message": "at 10:00"}) is False
    # Another failure, or a value where a failure was recorded: conflict.
    assert await store.steps.record_late_observation(
        stale, "call", error={"name": "Timeout", "message": "t"}) is True
    assert await store.steps.record_late_observation(stale, "call", value=1) is True
    # Nothing recorded under that key yet: nothing to compare with.
    assert await store.steps.record_late_observation(stale, "later", value=1) is None
    # A rejected write that observed no result (e.g. a start_child): NULL too.
    assert await store.steps.record_late_observation(stale, "call") is None
    # ... unless the caller says None *was* the result: then it is compared.
    assert await store.steps.record_late_observation(stale, "call", observed=True) is True

    flags = [o["conflict"] for o in await observations(pool, "lo-err")]
    assert flags == [False, True, True, None, None, True]
    assert await counter(pool, "lo-err") == 3
    assert len(await conflict_events(pool, "lo-err")) == 3


async def test_a_late_none_result_equal_to_a_recorded_none_is_no_conflict(store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-none")
    await store.steps.write_step(current, "noop", value=None)
    assert await store.steps.record_late_observation(stale, "noop", value=None, observed=True) is False
    assert await store.steps.record_late_observation(stale, "noop", value=0) is True


async def test_a_rejected_acknowledgement_is_compared_with_the_terminal_outcome(
        store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-ack")
    # Not terminal yet: nothing to compare with.
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "completed", "result": {"n": 1}}) is None
    await store.leases.acknowledge(current, "completed", result={"n": 1})

    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "completed", "result": {"n": 1}}) is False
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "completed", "result": {"n": 2}}) is True
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "failed", "result": None},
        error={"name": "Boom", "message": "m"}) is True
    # A suspension is no outcome: nothing to compare.
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "suspended", "result": None}) is None

    assert await counter(pool, "lo-ack") == 2
    details = [e["detail"] for e in await conflict_events(pool, "lo-ack")]
    assert [d["stepKey"] for d in details] == [None, None]
    record = await store.history.get("lo-ack")
    assert (record["status"], record["outcome"]) == ("completed", {"result": {"n": 1}})


async def test_a_failed_outcome_is_compared_by_error_name(store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-ackf")
    await store.leases.acknowledge(current, "failed", error={"name": "Declined", "message": "m1"})
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "failed", "result": None},
        error={"name": "Declined", "message": "m2"}) is False
    assert await store.steps.record_late_observation(
        stale, None, value={"acknowledge": "completed", "result": 1}) is True


async def test_the_observation_list_reads_the_flag(store, pool, clock):
    stale, current = await stale_and_current(store, clock, "lo-read")
    await store.steps.write_step(current, "s", value=1)
    await store.steps.record_late_observation(stale, "s", value=2)
    [obs] = await store.history.late_observations("lo-read")
    assert obs["conflict"] is True
