"""Operator decisions on a schedule: pause, resume, delete. Each is logged
with who made it; a schedule that does not exist is SCHEDULE_NOT_FOUND."""

from __future__ import annotations

from app.commands.errors import CommandError
from app.logs import operator_action
from app.registry import SCHEDULE_ID_RE
from app.store.records import ScheduleRead


def schedule_not_found(schedule_id: str) -> CommandError:
    return CommandError(
        404, "SCHEDULE_NOT_FOUND",
        f"no schedule with ID {schedule_id[:200]!r}; list them with GET /v1/schedules",
    )


def check_schedule_id(schedule_id: str) -> None:
    # No stored schedule has another shape (and NUL would not reach Postgres).
    if not SCHEDULE_ID_RE.match(schedule_id):
        raise schedule_not_found(schedule_id)


async def set_paused(store, schedule_id: str, paused: bool, by: str) -> ScheduleRead:
    """Pause (no slot fires) or resume (slots after now fire); the schedule."""
    check_schedule_id(schedule_id)
    row = await store.schedules.set_schedule_paused(schedule_id, paused, by=by)
    operator_action("pause" if paused else "resume", by=by,
                    result="not_found" if row is None else "done", schedule_id=schedule_id)
    if row is None:
        raise schedule_not_found(schedule_id)
    return row


async def delete(store, schedule_id: str, by: str) -> None:
    """Delete the schedule and its events; the executions it admitted stay."""
    check_schedule_id(schedule_id)
    deleted = await store.schedules.delete_schedule(schedule_id)
    operator_action("delete", by=by, result="done" if deleted else "not_found",
                    schedule_id=schedule_id)
    if not deleted:
        raise schedule_not_found(schedule_id)
