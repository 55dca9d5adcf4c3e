"""What a delivery records besides its steps, on Citus: durable timers, the
failed attempts of a step, and a stale holder's late observation. Each is
fenced and written on the node holding the execution (app/store/on_shard.py),
and every event of an execution takes its ID there, so its history reads in
the order it was written."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.steps import ATTEMPT_HISTORY
from app.store.types import LeaseLost
from tests.citus.rows import event_kinds, insert, lease, node

pytestmark = pytest.mark.citus


async def test_timers_on_every_node_are_fenced_and_keep_their_time(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"sleeping-{i}" for i in range(12)]
    assert len({await node(pool, eid) for eid in ids}) == 2
    for eid in ids:
        await insert(pool, eid, "running", token=2)
        with pytest.raises(LeaseLost):
            await store.steps.record_timer(lease(eid, 1), "nap", delay_seconds=60)
        wake_at, db_now, interrupt = await store.steps.record_timer(
            lease(eid, 2), "nap", delay_seconds=60)
        assert interrupt is None
        assert timedelta(seconds=59) < wake_at - db_now <= timedelta(seconds=60), eid
        # Recorded once: asked again, the timer keeps its time.
        again, _, _ = await store.steps.record_timer(lease(eid, 2), "nap", delay_seconds=600)
        assert again == wake_at
        assert await event_kinds(pool, eid) == ["fenced_write_rejected", "step_recorded"]


async def test_failed_attempts_are_fenced_and_trimmed_on_the_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await insert(pool, "retrying", "running", token=2)
    with pytest.raises(LeaseLost):
        await store.steps.record_attempt(lease("retrying", 1), "call", 1, {"name": "E"})
    for attempt in range(1, ATTEMPT_HISTORY + 6):
        await store.steps.record_attempt(lease("retrying", 2), "call", attempt,
                                         {"name": "E", "message": str(attempt)})
    kept = [a["attempt"] for a in await store.history.attempt_history("retrying")]
    assert kept == list(range(6, ATTEMPT_HISTORY + 6)), kept
    assert (await event_kinds(pool, "retrying")).count("attempt_failed") == ATTEMPT_HISTORY + 5


async def test_a_late_observation_and_every_event_read_in_the_order_written(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await insert(pool, "observed", "running", token=2)
    await store.steps.write_step(lease("observed", 2), "one", value=1, function_name="f")
    await store.steps.record_timer(lease("observed", 2), "nap", delay_seconds=1)
    await store.steps.record_attempt(lease("observed", 2), "two", 1, {"name": "E"})
    # The holder of token 1 was paused and saw something else for step one.
    assert await store.steps.record_late_observation(lease("observed", 1), "one",
                                                     value=2) is True
    assert await store.steps.record_late_observation(lease("observed", 1), "one",
                                                     value=1) is False
    await store.leases.acknowledge(lease("observed", 2), "completed", result={"one": 1})
    assert await event_kinds(pool, "observed") == [
        "step_recorded", "step_recorded", "attempt_failed", "integrity_conflict",
        "acknowledged"]
    assert await pool.fetchval(
        "SELECT integrity_conflicts FROM executions WHERE execution_id = 'observed' "
        "AND bucket = fencepost_bucket('observed')") == 1
