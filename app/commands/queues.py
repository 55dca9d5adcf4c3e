"""Operator decisions on a queue: change its run-time settings (or reset
them to the declared ones), pause, resume; and reading one. Each decision
is logged with who made it. Settings are the stored snake_case ones
(app.queues.SETTINGS); a None limit means "no limit"."""

from __future__ import annotations

from typing import Any

from app.commands.errors import UNSTORABLE_TEXT, CommandError
from app.logs import operator_action
from app.queues import SETTINGS, QueueSettingsError, check_name, check_settings

# The rate limit is one setting in three stored fields: they are reset together.
RATE_FIELDS = ("rate_limit", "rate_per_key", "rate_period")
CHANGES_SHOWN = 20


def queue_not_found(name: str) -> CommandError:
    return CommandError(
        404, "QUEUE_NOT_FOUND",
        f"no queue named {name[:200]!r}; list them with GET /v1/queues",
    )


def invalid_settings(message: str) -> CommandError:
    return CommandError(422, "INVALID_QUEUE_SETTINGS", f"{message}; fix it and send it again")


def checked_change(name: str, settings: dict[str, Any],
                   reset: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The settings as stored and the fields to reset (a rate field stands
    for all three), or INVALID_QUEUE_SETTINGS saying what is wrong."""
    try:
        check_name(name)
        settings = check_settings(settings)
        unknown = sorted(set(reset) - set(SETTINGS))
        if unknown:
            raise QueueSettingsError(f"reset: unknown queue settings: {', '.join(unknown)}")
    except QueueSettingsError as exc:
        raise invalid_settings(str(exc)) from None
    if "rate_per_key" in settings and "rate_limit" not in settings:
        raise invalid_settings(
            "rate_per_key is set with rate_limit and rate_period (the rate limit it applies to)")
    fields = set(reset)
    if fields & set(RATE_FIELDS):
        fields |= set(RATE_FIELDS)
    return settings, sorted(fields)


async def change_queue(store, name: str, settings: dict[str, Any], reset: list[str],
                       by: str) -> dict[str, Any]:
    """Reset the fields in `reset` to the declared values, then set the
    run-time settings given (they win over the declared ones; a field both
    reset and given takes the given value); a queue nobody declared is
    created. Returns the queue's settings row."""
    settings, fields = checked_change(name, settings, reset)
    row = await store.queues.change(name, settings, actor=by, reset=fields)
    _log("change", by, name)
    return row


async def pause(store, name: str, by: str) -> dict[str, Any]:
    """Nothing of the queue is claimed until it is resumed (what runs goes
    on). A queue that does not exist is QUEUE_NOT_FOUND."""
    return await _set_paused(store, name, True, by)


async def resume(store, name: str, by: str) -> dict[str, Any]:
    return await _set_paused(store, name, False, by)


async def _set_paused(store, name: str, paused: bool, by: str) -> dict[str, Any]:
    # Only a queue that exists: a typo must not create a paused queue.
    if UNSTORABLE_TEXT.search(name) or await store.queues.get(name) is None:
        _log("pause" if paused else "resume", by, name, "not_found")
        raise queue_not_found(name)
    row = await store.queues.change(name, {"paused": paused}, actor=by, reset=[])
    _log("pause" if paused else "resume", by, name)
    return row


async def read_queue(store, name: str) -> dict[str, Any]:
    """`queue` (the settings row), `counts` (running, due, starts_in_period)
    and `changes` (the newest first, at most CHANGES_SHOWN)."""
    if UNSTORABLE_TEXT.search(name):
        raise queue_not_found(name)
    row = await store.queues.get(name)
    if row is None:
        raise queue_not_found(name)
    counts = await store.queues.counts([name])
    return {"queue": row,
            "counts": counts.get(name, {"running": 0, "due": 0, "starts_in_period": None}),
            "changes": await store.queues.changes(name, CHANGES_SHOWN)}


def _log(action: str, by: str, name: str, result: str = "done") -> None:
    operator_action(action, by=by, result=result, queue=name)
