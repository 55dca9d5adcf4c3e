"""Schedules: definitions, pause/resume, and the per-schedule evaluation turn.

A schedule's slots are admitted by `admit` under the execution ID
`{schedule_id}~{slot in UTC}`; the unique execution ID is what makes a slot
fire once. On top of that, a worker evaluates a schedule only while holding
its row lock (`FOR UPDATE SKIP LOCKED`), so evaluations of one schedule do
not overlap: `last_slot` only moves forward and skip events are written once.

Schedule events live in their own table, `schedule_events` (kinds
`schedule_created`, `schedule_fired`, `schedule_slots_skipped`,
`schedule_paused`, `schedule_resumed`), never in `execution_events`: an
execution's history holds only that execution's events, whatever its ID
(a client may admit an execution named `schedule:nightly`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from app.store.handle import StoreObject
from app.store.records import ScheduleEventRecord, ScheduleRead, ScheduleRecord, record, records
from app.store.types import InvalidEvent

_COLUMNS = """schedule_id, workflow_id, cron, timezone, params, paused, catch_up, source,
              created_at, last_slot, updated_at"""


@dataclass
class ScheduleTurn:
    """One worker's exclusive evaluation of one schedule: the locked row and
    the database time the evaluation runs up to."""

    conn: asyncpg.Connection
    schedule: ScheduleRecord
    now: datetime

    async def finish(self, until: datetime, *, skipped: int = 0,
                     detail: dict[str, Any] | None = None) -> None:
        """Advance last_slot to `until` (never backwards) and, if slots were
        skipped, record how many; commits with the turn."""
        schedule_id = self.schedule["schedule_id"]
        await self.conn.execute(
            """
            WITH adv AS (
                UPDATE schedules
                SET last_slot = greatest(last_slot, $2), updated_at = now()
                WHERE schedule_id = $1
                RETURNING schedule_id
            )
            INSERT INTO schedule_events (schedule_id, kind, detail)
            SELECT schedule_id, 'schedule_slots_skipped',
                   $4::jsonb || jsonb_build_object('skipped', $3::int)
            FROM adv WHERE $3::int > 0
            """,
            schedule_id,
            until,
            skipped,
            detail or {},
        )


class Schedules(StoreObject):
    async def create_schedule(
        self,
        *,
        schedule_id: str,
        workflow_id: str,
        cron: str,
        timezone: str,
        params: Any,
        catch_up: int | None = None,
        by: str | None = None,
    ) -> tuple[bool, ScheduleRecord]:
        """(True, the new schedule) or (False, the schedule that already holds
        the ID; nothing changed). Slots after creation time fire."""
        try:
            row = await self.db.fetchrow(
                f"""
                WITH ins AS (
                    INSERT INTO schedules (schedule_id, workflow_id, cron, timezone, params,
                                           catch_up, source)
                    VALUES ($1, $2, $3, $4, coalesce($5, 'null'::jsonb), $6, 'api')
                    ON CONFLICT (schedule_id) DO NOTHING
                    RETURNING {_COLUMNS}
                ), ev AS (
                    INSERT INTO schedule_events (schedule_id, kind, detail)
                    SELECT schedule_id, 'schedule_created',
                           jsonb_build_object('source', 'api', 'by', $7::text, 'cron', cron,
                                              'timezone', timezone)
                    FROM ins
                )
                SELECT * FROM ins
                """,
                schedule_id, workflow_id, cron, timezone, params, catch_up, by,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc
        if row is not None:
            return True, record(ScheduleRecord, row)
        existing = await self.get_schedule(schedule_id)
        if existing is None:  # deleted in between; try once more
            return await self.create_schedule(
                schedule_id=schedule_id, workflow_id=workflow_id, cron=cron, timezone=timezone,
                params=params, catch_up=catch_up, by=by,
            )
        return False, existing

    async def upsert_code_schedule(
        self, *, schedule_id: str, workflow_id: str, cron: str, timezone: str, params: Any
    ) -> ScheduleRecord | None:
        """Create or update a schedule declared in workflow code. An existing
        schedule keeps `paused`, `catch_up` and `last_slot` (so a restart
        neither refires nor forgets slots); code owns the definition."""
        row = await self.db.fetchrow(
            f"""
            -- The time is the inserted row's: Citus refuses now() in ON
            -- CONFLICT DO UPDATE (schedules is a reference table).
            INSERT INTO schedules (schedule_id, workflow_id, cron, timezone, params, source,
                                   updated_at)
            VALUES ($1, $2, $3, $4, $5, 'code', now())
            ON CONFLICT (schedule_id) DO UPDATE
            SET workflow_id = excluded.workflow_id, cron = excluded.cron,
                timezone = excluded.timezone, params = excluded.params, source = 'code',
                updated_at = excluded.updated_at
            WHERE (schedules.workflow_id, schedules.cron, schedules.timezone, schedules.params,
                   schedules.source)
                  IS DISTINCT FROM (excluded.workflow_id, excluded.cron, excluded.timezone,
                                    excluded.params, excluded.source)
            RETURNING {_COLUMNS}
            """,
            schedule_id, workflow_id, cron, timezone, params,
        )
        # Unchanged (the upsert's WHERE found nothing to change): as stored
        # (None only if deleted meanwhile).
        return (record(ScheduleRecord, row) if row is not None
                else await self.get_schedule(schedule_id))

    async def drop_code_schedules(self, workflow_ids: list[str]) -> list[str]:
        """Delete the code-defined schedules of these workflows (their code no
        longer declares one), with their events; returns the IDs deleted."""
        rows = await self.db.fetch(
            """
            WITH d AS (
                DELETE FROM schedules
                WHERE source = 'code' AND schedule_id = workflow_id
                  AND workflow_id = ANY($1::text[])
                RETURNING schedule_id
            ), ev AS (
                -- Only the schedule's own history: never an execution's events.
                DELETE FROM schedule_events
                WHERE schedule_id IN (SELECT schedule_id FROM d)
            )
            SELECT schedule_id FROM d
            """,
            list(workflow_ids),
        )
        return [r["schedule_id"] for r in rows]

    async def get_schedule(self, schedule_id: str) -> ScheduleRead | None:
        """The schedule, with the database's `now` (to say when it fires next)."""
        row = await self.db.fetchrow(
            f"SELECT {_COLUMNS}, now() AS db_now FROM schedules WHERE schedule_id = $1",
            schedule_id,
        )
        return record(ScheduleRead, row) if row is not None else None

    async def list_schedules(
        self, *, workflow_id: str | None = None, after: str | None = None, limit: int = 100
    ) -> tuple[list[ScheduleRead], str | None]:
        """Ordered by schedule ID; `after` is the last ID of the previous page."""
        rows = await self.db.fetch(
            f"""
            SELECT {_COLUMNS}, now() AS db_now FROM schedules
            WHERE ($1::text IS NULL OR workflow_id = $1)
              AND ($2::text IS NULL OR schedule_id > $2)
            ORDER BY schedule_id
            LIMIT $3
            """,
            workflow_id, after, limit + 1,
        )
        page = records(ScheduleRead, rows[:limit])
        return page, (page[-1]["schedule_id"] if len(rows) > limit else None)

    async def set_schedule_paused(self, schedule_id: str, paused: bool,
                                  by: str | None = None) -> ScheduleRead | None:
        """Pause or resume; None if there is no such schedule. Resuming moves
        last_slot to now: slots that passed while paused do not fire. Setting
        the state it already has changes nothing and records nothing."""
        await self.db.execute(
            """
            WITH upd AS (
                UPDATE schedules
                SET paused = $2, updated_at = now(),
                    last_slot = CASE WHEN $2 THEN last_slot ELSE greatest(last_slot, now()) END
                WHERE schedule_id = $1 AND paused IS DISTINCT FROM $2
                RETURNING schedule_id
            )
            INSERT INTO schedule_events (schedule_id, kind, detail)
            SELECT schedule_id,
                   CASE WHEN $2 THEN 'schedule_paused' ELSE 'schedule_resumed' END,
                   jsonb_build_object('by', $3::text)
            FROM upd
            """,
            schedule_id, paused, by,
        )
        return await self.get_schedule(schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete a schedule and its events. Executions it admitted stay."""
        deleted = await self.db.fetchval(
            """
            WITH d AS (
                DELETE FROM schedules WHERE schedule_id = $1 RETURNING schedule_id
            ), ev AS (
                -- Only the schedule's own history: never an execution's events.
                DELETE FROM schedule_events
                WHERE schedule_id = $1 AND EXISTS (SELECT 1 FROM d)
            )
            SELECT count(*) FROM d
            """,
            schedule_id,
        )
        return bool(deleted)

    async def schedule_events(self, schedule_id: str, limit: int = 100) -> list[ScheduleEventRecord]:
        """The newest `limit` events of a schedule, oldest first."""
        rows = await self.db.fetch(
            """
            SELECT * FROM (
                SELECT event_id, at, kind, detail FROM schedule_events
                WHERE schedule_id = $1 ORDER BY event_id DESC LIMIT $2
            ) e ORDER BY event_id
            """,
            schedule_id, limit,
        )
        return records(ScheduleEventRecord, rows)

    async def schedule_history(self, schedule_id: str, limit: int = 100) -> list[ScheduleEventRecord] | None:
        """The newest `limit` events of a schedule, oldest first; None when
        there is no such schedule (one statement: a schedule deleted while
        the request runs is not answered with an empty history)."""
        rows = await self.db.fetch(
            """
            SELECT ev.event_id, ev.at, ev.kind, ev.detail
            FROM (SELECT schedule_id FROM schedules WHERE schedule_id = $1) s
            LEFT JOIN LATERAL (
                SELECT * FROM (
                    SELECT event_id, at, kind, detail FROM schedule_events
                    WHERE schedule_id = s.schedule_id ORDER BY event_id DESC LIMIT $2
                ) newest ORDER BY event_id
            ) ev ON true
            """,
            schedule_id, limit,
        )
        if not rows:
            return None
        return records(ScheduleEventRecord, (r for r in rows if r["event_id"] is not None))

    # ------------------------------------------------------------- evaluation

    async def due_schedules(self, workflow_ids: list[str]) -> list[ScheduleRead]:
        """Unpaused schedules of these workflows, with the database's `now`
        (candidates: `schedule_turn` re-reads each under its lock)."""
        rows = await self.db.fetch(
            f"""
            SELECT {_COLUMNS}, now() AS db_now FROM schedules
            WHERE NOT paused AND workflow_id = ANY($1::text[]) AND last_slot < now()
            ORDER BY schedule_id
            """,
            list(workflow_ids),
        )
        return records(ScheduleRead, rows)

    @contextlib.asynccontextmanager
    async def schedule_turn(self, schedule_id: str) -> AsyncIterator[ScheduleTurn | None]:
        """Lock an unpaused schedule for evaluation, or yield None when it is
        paused, gone, or being evaluated by another worker right now. The turn
        commits when the block ends normally and rolls back on an exception."""
        async with self.db.connection() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"""
                SELECT {_COLUMNS}, now() AS db_now FROM schedules
                WHERE schedule_id = $1 AND NOT paused
                FOR UPDATE SKIP LOCKED
                """,
                schedule_id,
            )
            if row is None:
                yield None
                return
            schedule = record(ScheduleRead, row)
            yield ScheduleTurn(conn, schedule, schedule["db_now"])

    async def record_schedule_fired(self, schedule_id: str, execution_id: str,
                                    slot: datetime) -> None:
        await self.db.execute(
            """
            INSERT INTO schedule_events (schedule_id, kind, detail)
            VALUES ($1, 'schedule_fired', jsonb_build_object('executionId', $2::text,
                                                             'slot', $3::timestamptz))
            """,
            schedule_id, execution_id, slot,
        )

    async def prune_schedule_events(self, workflow_ids: list[str],
                                    older_than_seconds: float) -> int:
        """Delete the events of these workflows' schedules older than the
        retention age (schedule events belong to no execution, so the
        execution pruner never reaches them)."""
        return int(await self.db.fetchval(
            """
            WITH d AS (
                DELETE FROM schedule_events
                WHERE schedule_id IN (SELECT schedule_id FROM schedules
                                      WHERE workflow_id = ANY($1::text[]))
                  AND at < now() - make_interval(secs => $2)
                RETURNING 1
            )
            SELECT count(*) FROM d
            """,
            list(workflow_ids), float(older_than_seconds),
        ))
