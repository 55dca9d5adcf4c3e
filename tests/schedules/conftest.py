"""Fixtures for the schedule tests (real Postgres, per-test database).

  WORKFLOWS        the sched-test-* workflows of tests/schedules/flows.py
  store            ExecutionStore on the test pool
  make_schedule    `await make_schedule("s1", "0 0 * * *", tz="UTC", catch_up=None,
                   workflow_id="sched-test-plain", params={})` -> row (via the store)
  set_last_slot    `await set_last_slot("s1", "date_trunc('day', now()) - interval '10 days'")`:
                   moves the schedule's evaluated-up-to instant (SQL expression)
  executions_of    `await executions_of("s1")` -> sorted execution IDs admitted for it
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from app.registry import load_workflows
from app.store import ExecutionStore

WORKFLOWS = load_workflows(["tests.schedules.flows"])
assert set(WORKFLOWS) == {"sched-test-minutely", "sched-test-nightly", "sched-test-plain"}


@pytest.fixture
def make_schedule(store: ExecutionStore) -> Callable:
    async def _make(schedule_id: str, cron: str, *, tz: str = "UTC", catch_up: int | None = None,
                    workflow_id: str = "sched-test-plain", params=None) -> dict:
        created, row = await store.schedules.create_schedule(
            schedule_id=schedule_id, workflow_id=workflow_id, cron=cron, timezone=tz,
            params={} if params is None else params, catch_up=catch_up,
        )
        assert created, row
        return row

    return _make


@pytest.fixture
def set_last_slot(pool: asyncpg.Pool) -> Callable:
    async def _set(schedule_id: str, sql: str) -> None:
        done = await pool.execute(
            f"UPDATE schedules SET last_slot = {sql} WHERE schedule_id = $1", schedule_id
        )
        assert done == "UPDATE 1", done

    return _set


@pytest.fixture
def executions_of(pool: asyncpg.Pool) -> Callable:
    async def _of(schedule_id: str) -> list[str]:
        rows = await pool.fetch(
            "SELECT execution_id FROM executions WHERE starts_with(execution_id, $1) "
            "ORDER BY execution_id",
            schedule_id + "~",
        )
        return [r["execution_id"] for r in rows]

    return _of
