"""Bulk operations: one action over every execution a filter matches, carried
out by workers in bounded batches. Starting one stores its items (what the
filter matches now); stopping one leaves what was done done."""

from __future__ import annotations

import re
from typing import Any

from app.commands.errors import API, CommandError, Wording
from app.store.bulk import ACTIONS
from app.store.records import OperationRecord

OPERATION_ID = re.compile(r"op-[0-9a-f]{16}")


def operation_not_found(operation_id: str, hint: str | None = None) -> CommandError:
    message = f"no operation {operation_id[:100]!r}"
    return CommandError(404, "OPERATION_NOT_FOUND", f"{message}; {hint}" if hint else message)


def check_operation_id(operation_id: str, hint: str | None = None) -> None:
    """An ID of another shape names no operation (and is not looked up)."""
    if not OPERATION_ID.fullmatch(operation_id):
        raise operation_not_found(operation_id, hint)


async def start_operation(store, action: str, spec: dict[str, Any], by: str, *,
                          options: dict[str, Any], reason: str | None, max_matched: int,
                          wording: Wording = API) -> OperationRecord:
    """The operation's record, its items stored; refused when the filter
    matches more than `max_matched` executions."""
    if action not in ACTIONS:
        raise CommandError(422, "INVALID_REQUEST", f"action: one of {', '.join(ACTIONS)}")
    if not spec:
        raise CommandError(422, "INVALID_REQUEST", "filter: give at least one condition")
    record = await store.operations.create_operation(action, spec, by=by, options=options, reason=reason,
                                          max_matched=max_matched)
    if record is None:
        raise CommandError(
            422, "TOO_MANY_MATCHED",
            f"the filter matches more than {max_matched} executions "
            f"(FENCEPOST_MAX_OPERATION_EXECUTIONS); narrow it (e.g. {wording.time_filters}) "
            "and start several operations")
    return record


async def stop_operation(store, operation_id: str, by: str) -> OperationRecord:
    """Stop a running operation: items not yet carried out are never acted on."""
    check_operation_id(operation_id)
    answer, record = await store.operations.cancel_operation(operation_id, by)
    if answer == "not_found":
        raise operation_not_found(operation_id)
    if answer == "finished":
        raise CommandError(409, "OPERATION_FINISHED",
                           f"operation {operation_id!r} already {record['status']}; nothing to "
                           "stop", status=record["status"])
    return record
