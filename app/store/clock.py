"""The database clock, the only clock: every time is `now()` in SQL.

`now` and `deadline_passed` read it. The family statements are the test
harness's (app.testing): they move an environment's recorded times instead
of the clock. "An hour passes" for a set of executions is the same as every
time recorded for them being an hour earlier; those statements are for a
test database only, nothing in the service calls them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from app.store.handle import StoreObject
from app.store.types import NOTIFY_CHANNEL

# The executions an environment started and every child below them
# (children carry parent_execution_id), each with its bucket.
_FAMILY = """
    WITH RECURSIVE family AS (
        -- Citus: a family's executions are in many buckets (a child's is its own ID's).
        SELECT execution_id, bucket FROM executions WHERE execution_id = ANY($1::text[])
        UNION
        SELECT c.execution_id, c.bucket
        FROM executions c JOIN family f ON c.parent_execution_id = f.execution_id
    )
"""


class Clock(StoreObject):
    async def db_now(self) -> datetime:
        """now() of the database."""
        return cast("datetime", await self.db.fetchval("SELECT now()"))

    async def deadline_passed(self, deadline: datetime) -> tuple[bool, datetime]:
        """(deadline <= now, now) by the database clock, the clock every
        deadline is judged by. Admission asks right before it admits: a
        deadline that passes between this read and the insert is one the
        execution reaches at once after admission, which is where it would
        end anyway (timed_out); no request with a past deadline is stored."""
        row = await self.db.fetchrow(
            "SELECT $1::timestamptz <= now() AS passed, now() AS now", deadline)
        assert row is not None  # the statement always returns its row
        return row["passed"], row["now"]

    async def family_busy(self, roots: Sequence[str]) -> int:
        """How many executions of the family are being delivered or due now
        (running, or admitted/suspended with a wake at or before now()). Time is
        moved only when this is 0: moving it under a held lease would lapse the lease."""
        return int(await self.db.fetchval(
            _FAMILY + """
            SELECT count(*) FROM executions e JOIN family USING (execution_id, bucket)
            WHERE e.status = 'running'
               OR (e.status IN ('admitted', 'suspended') AND e.due_at <= now())
            """,
            list(roots),
        ))

    async def shift_family_times(self, roots: Sequence[str], seconds: float) -> int:
        """Move every time recorded for the family `seconds` into the past, in
        one statement (so no reader sees half a move): wakes, deadlines, lease
        and redelivery times, cancel times, the wake time of each recorded timer
        step (sleeps and signal timeouts, function_name 'sleep') and of the
        waiting_on summary, effect start times, signal arrival times. Events
        keep their times (history). Idle workers are notified, as a due wake
        would. Returns how many executions moved."""
        row = await self.db.fetchrow(
            _FAMILY + f"""
            , d AS (SELECT make_interval(secs => $2::float8) AS by)
            , ex AS (
                UPDATE executions e SET
                    admitted_at = e.admitted_at - d.by,
                    due_at = e.due_at - d.by,
                    covered_due_at = e.covered_due_at - d.by,
                    deadline = e.deadline - d.by,
                    lease_expires_at = e.lease_expires_at - d.by,
                    redeliver_after = e.redeliver_after - d.by,
                    last_unacknowledged_at = e.last_unacknowledged_at - d.by,
                    cancel_requested_at = e.cancel_requested_at - d.by,
                    waiting_on = CASE
                        WHEN jsonb_typeof(e.waiting_on -> 'until') = 'string'
                        THEN jsonb_set(e.waiting_on, '{{until}}',
                                       to_jsonb((e.waiting_on ->> 'until')::timestamptz - d.by))
                        ELSE e.waiting_on END
                FROM d, family f
                WHERE e.execution_id = f.execution_id AND e.bucket = f.bucket
                RETURNING 1
            ), st AS (
                UPDATE execution_steps s
                SET value = to_jsonb((s.value #>> '{{}}')::timestamptz - d.by)
                FROM d, family f
                WHERE s.execution_id = f.execution_id AND s.bucket = f.bucket
                  AND s.function_name = 'sleep'
                  AND jsonb_typeof(s.value) = 'string'
                RETURNING 1
            ), ef AS (
                UPDATE effects x SET started_at = x.started_at - d.by, updated_at = x.updated_at - d.by
                FROM d, family f WHERE x.execution_id = f.execution_id AND x.bucket = f.bucket
                RETURNING 1
            ), sg AS (
                UPDATE signals g SET received_at = g.received_at - d.by
                FROM d, family f WHERE g.execution_id = f.execution_id AND g.bucket = f.bucket
                RETURNING 1
            ), n AS (SELECT pg_notify('{NOTIFY_CHANNEL}', ''))
            SELECT (SELECT count(*) FROM ex) AS moved, (SELECT count(*) FROM n) AS notified
            """,
            list(roots),
            float(seconds),
        )
        assert row is not None  # the statement always returns its row
        return int(row["moved"])

    async def family_statuses(self, roots: Sequence[str]) -> dict[str, str]:
        """execution ID -> status, for the family."""
        rows = await self.db.fetch(
            _FAMILY + "SELECT e.execution_id, e.status FROM executions e "
            "JOIN family USING (execution_id, bucket)",
            list(roots),
        )
        return {r["execution_id"]: r["status"] for r in rows}

    async def family_next_wake(self, roots: Sequence[str]) -> float | None:
        """Seconds from now() to the earliest pending wake or deadline of the
        family's unfinished executions (at least 0), or None when nothing waits on time."""
        return cast("float | None", await self.db.fetchval(
            _FAMILY + """
            SELECT greatest(0, extract(epoch FROM min(least(
                       CASE WHEN e.status IN ('admitted', 'suspended') THEN e.due_at END,
                       e.deadline) - now())))::float8
            FROM executions e JOIN family USING (execution_id, bucket)
            WHERE e.status NOT IN ('completed', 'failed', 'cancelled', 'timed_out')
            """,
            list(roots),
        ))
