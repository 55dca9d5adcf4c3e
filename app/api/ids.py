"""The client ID rule: IDs fencepost derives are not the clients' to take.

Children (`{parent}~{key}`) and schedule slots (`{scheduleId}~{slot in UTC}`)
are admitted under IDs that join their parts with `~`, a character outside
the client ID alphabet (A-Z a-z 0-9 . _ : -). Admission refuses an ID
containing `~` from clients with its own code, so no client can admit a
derived ID first (squatting a child's or a slot's ID would fail the parent or
suppress the scheduled run). Executions stored under the older `:` forms
keep their IDs.
"""

from __future__ import annotations

from typing import Any

from app.api.errors import ApiError
from app.registry import SYSTEM_ID_SEPARATOR


def reserved_id_error(what: str, value: str) -> ApiError:
    return ApiError(
        422, "RESERVED_EXECUTION_ID",
        f"{what} {value!r} contains {SYSTEM_ID_SEPARATOR!r}: IDs with {SYSTEM_ID_SEPARATOR!r} are "
        "made by fencepost for child executions and schedule slots, and clients cannot admit "
        "them; choose an ID from A-Z a-z 0-9 . _ : -",
        field=what,
    )


def check_client_execution_id(value: Any, what: str = "executionId") -> None:
    """422 RESERVED_EXECUTION_ID for a client-chosen ID in the system form.
    Anything else (absent, not a string, another bad character) is left to
    the request model's own validation."""
    if isinstance(value, str) and SYSTEM_ID_SEPARATOR in value:
        raise reserved_id_error(what, value)
