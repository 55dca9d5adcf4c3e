"""Every store read returns exactly its record's keys (app/store/records.py).

The records are TypedDicts: the type checker reads each caller against them,
while at run time the rows stay plain dicts. These tests hold the two
together against real Postgres: a column a statement adds, renames or drops
that its record does not name fails here, not in some caller.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from app.store import ExecutionStore
from app.store.operator import cancel_tree
from app.store.placement import placement_of
from app.store.records import (
    ActivityMinute,
    AttemptRecord,
    DashboardExecution,
    DashboardQueue,
    EventRecord,
    HealedExecution,
    LateObservation,
    MetricsSnapshot,
    OperationFailure,
    OperationRecord,
    OutcomeUnknownEffect,
    QueueChangeRecord,
    QueueCounts,
    QueueGauges,
    QueueLimits,
    QueueSettings,
    ScheduleEventRecord,
    ScheduleRead,
    ScheduleRecord,
    SessionToken,
    StepDetail,
    StepPageRow,
    TokenRecord,
    TokenSecret,
    TreeCancelled,
    WorkerHolder,
    WorkerRecord,
)
from tests.support.admission import admitting
from tests.support.claims import claim_one

admit = admitting("rec", params={})


def keys(kind: Any) -> set[str]:
    return set(kind.__required_keys__ | kind.__optional_keys__)


def conforms(value: Any, hint: Any) -> bool:
    """Whether `value` is of type `hint` (a record's value types: classes,
    unions with None, and generic dicts, lists and tuples by their origin)."""
    if hint is Any:
        return True
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(conforms(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        return (isinstance(value, dict) and set(value) == keys(hint)
                and all(conforms(v, hints[k]) for k, v in value.items()))
    origin = typing.get_origin(hint)
    if origin is not None:
        if origin is list and isinstance(value, list):
            (item,) = typing.get_args(hint)
            return all(conforms(v, item) for v in value)
        return isinstance(value, origin)
    # bool is an int in Python; a record's int is never a bool.
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


def shaped(rows: Iterable[Mapping[str, Any]] | Mapping[str, Any] | None, kind: Any) -> None:
    """Each row (at least one) has exactly `kind`'s keys, each value of its type."""
    assert rows is not None, f"nothing read to check {kind.__name__} against"
    rows = [rows] if isinstance(rows, Mapping) else list(rows)
    assert rows, f"nothing read to check {kind.__name__} against"
    hints = typing.get_type_hints(kind)
    for row in rows:
        assert set(row) == keys(kind), (kind.__name__, sorted(set(row) ^ keys(kind)))
        wrong = {k: v for k, v in row.items() if not conforms(v, hints[k])}
        assert not wrong, (kind.__name__, {k: (v, hints[k]) for k, v in wrong.items()})


async def test_the_reads_of_an_execution_and_its_history_return_their_records(
        store: ExecutionStore) -> None:
    eid = await admit(store, "rec-1")
    d = await claim_one(store, eid)
    await store.steps.write_step(d.lease, "a", value={"n": 1}, function_name="f")
    await store.steps.record_attempt(d.lease, "b", 1, {"name": "Boom", "message": "m"})
    await store.steps.record_late_observation(d.lease, "a", value={"n": 2})
    await store.effects.begin_effect(d.lease, "c", idempotency_key="k-1", function_name="g")
    assert await store.effects.park_outcome_unknown(d.lease, "c") == "parked"

    shaped(await store.history.get(eid), HealedExecution)
    page, _ = await store.history.list(limit=10)
    shaped(page, HealedExecution)
    shaped(await store.history.events(eid), EventRecord)
    shaped(await store.history.events_page(eid, after=0, limit=10), EventRecord)
    shaped(await store.history.execution_events_page(eid, after=0, limit=10), EventRecord)
    shaped(await store.history.late_observations(eid), LateObservation)
    shaped(await store.history.execution_late_observations_page(eid, after=0, limit=10),
           LateObservation)
    for include_values in (False, True):
        # The recorded step and the effect attempt in doubt: both shapes of row.
        details = await store.history.step_details(eid, include_values=include_values)
        assert {r["step_key"] for r in details} == {"a", "c"}
        shaped(details, StepDetail)
        steps = await store.history.execution_steps_page(
            eid, include_values=include_values, limit=10)
        assert steps is not None and {r["grp"] for r in steps} == {0, 1}
        shaped(steps, StepPageRow)
    shaped(await store.history.attempt_history(eid), AttemptRecord)

    listed, total = await store.dashboard.ui_list(live_workflows=set())
    assert total == 1
    shaped(listed, DashboardExecution)
    shaped(await store.dashboard.outcome_unknown_effects(eid), OutcomeUnknownEffect)
    _, minutes = await store.dashboard.activity_per_minute()
    shaped(minutes, ActivityMinute)


async def test_a_cancelled_tree_and_a_bulk_operation_return_their_records(
        store: ExecutionStore) -> None:
    waiting = await admit(store, "rec-wait")
    async with store.pool.connection() as conn, conn.transaction():
        placement = await placement_of(conn, store.config.placement)
        shaped(await cancel_tree(conn, placement, waiting, "test", False), TreeCancelled)

    # An operation over an execution that has ended: its one item fails.
    created = await store.operations.create_operation(
        "cancel", {"executionIds": [waiting]}, by="test")
    shaped(created, OperationRecord)
    assert created is not None
    assert await store.operations.run_operation_batch() == 1
    op = await store.operations.get_operation(created["operation_id"])
    shaped(op, OperationRecord)
    assert op is not None and op["failed"] == 1
    shaped(op["failures"], OperationFailure)
    answer, stopped = await store.operations.cancel_operation(created["operation_id"], "test")
    assert answer == "finished"
    shaped(stopped, OperationRecord)


async def test_the_reads_of_workers_tokens_sessions_and_schedules_return_their_records(
        store: ExecutionStore) -> None:
    assert await store.workers.register_worker(
        "w-1", host="h-1", pid=1, workflows=["rec"], concurrency=2) is None
    shaped(await store.workers.register_worker(
        "w-1", host="h-2", pid=2, workflows=["rec"], concurrency=2, live_within_seconds=60),
        WorkerHolder)
    shaped(await store.workers.list_workers(stale_after_seconds=60), WorkerRecord)
    shaped(await store.workers.metrics_snapshot(), MetricsSnapshot)

    await store.tokens.create_token("t-1", name="ops", role="operate", secret_sha256="0" * 64)
    shaped(await store.tokens.list_tokens(), TokenRecord)
    shaped(await store.tokens.find_token("t-1"), TokenSecret)
    assert await store.sessions.create_ui_session("1" * 64, "t-1", 60)
    state, token = await store.sessions.find_ui_session("1" * 64)
    assert state == "valid"
    shaped(token, SessionToken)

    created, row = await store.schedules.create_schedule(
        schedule_id="nightly", workflow_id="rec", cron="* * * * *", timezone="UTC", params={})
    assert created
    shaped(row, ScheduleRecord)
    created, row = await store.schedules.create_schedule(
        schedule_id="nightly", workflow_id="rec", cron="* * * * *", timezone="UTC", params={})
    assert not created
    shaped(row, ScheduleRead)
    shaped(await store.schedules.get_schedule("nightly"), ScheduleRead)
    listed, _ = await store.schedules.list_schedules()
    shaped(listed, ScheduleRead)
    shaped(await store.schedules.set_schedule_paused("nightly", True, by="test"), ScheduleRead)
    shaped(await store.schedules.set_schedule_paused("nightly", False, by="test"), ScheduleRead)
    shaped(await store.schedules.schedule_events("nightly"), ScheduleEventRecord)
    shaped(await store.schedules.schedule_history("nightly"), ScheduleEventRecord)
    shaped(await store.schedules.due_schedules(["rec"]), ScheduleRead)
    async with store.schedules.schedule_turn("nightly") as turn:
        assert turn is not None
        assert keys(ScheduleRecord) <= set(turn.schedule)
    shaped(await store.schedules.upsert_code_schedule(
        schedule_id="rec", workflow_id="rec", cron="0 * * * *", timezone="UTC", params={}),
        ScheduleRecord)
    # Unchanged: the upsert writes nothing and the schedule is read as stored.
    shaped(await store.schedules.upsert_code_schedule(
        schedule_id="rec", workflow_id="rec", cron="0 * * * *", timezone="UTC", params={}),
        ScheduleRead)


async def test_the_reads_of_queues_return_their_records(store: ExecutionStore) -> None:
    await store.queues.declare({"rec-q": {"concurrency": 1, "rate_limit": 5, "rate_period": 60}})
    held = await admit(store, "rec-q-1", queue="rec-q", concurrency_key="k", priority=-1)
    await claim_one(store, held)
    await admit(store, "rec-q-2", queue="rec-q", concurrency_key="k")

    shaped(await store.dashboard.queues(), DashboardQueue)
    shaped(await store.dashboard.queue_waiting("rec-q", live_workflows={"rec"}),
           DashboardExecution)
    snapshot = await store.workers.metrics_snapshot()
    shaped(snapshot["queues"].values(), QueueGauges)
    shaped([g["limits"] for g in snapshot["queues"].values()], QueueLimits)
    shaped(await store.queues.get("rec-q"), QueueSettings)
    shaped(await store.queues.list(), QueueSettings)
    shaped(await store.queues.change("rec-q", {"paused": True}, actor="test"), QueueSettings)
    shaped((await store.queues.counts(["rec-q"])).values(), QueueCounts)
    shaped(await store.queues.changes("rec-q"), QueueChangeRecord)
