"""Waiting for an observable event instead of sleeping for a fixed time: poll a
condition until it holds, or fail after a timeout naming what never happened.

  wait_until       poll a condition (sync or async) from a coroutine
  wait_until_sync  the same from plain code (a subprocess, a container)
  wait_status      an execution's (healed) record once its status is one of those given
  wait_record      an execution's (healed) record once a check of it holds
  wait_event       an execution's events of one kind once there are enough of them
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import asyncpg

# Errors of a database (or its socket) that is down or restarting: a test that
# waits for it to come back tolerates them.
DB_ERRORS: tuple[type[BaseException], ...] = (OSError, asyncpg.PostgresError,
                                              asyncpg.InterfaceError)


def _timed_out(what: str, timeout: float, last_error: BaseException | None,
               detail: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout:.1f}s waiting for {what}"
    if last_error is not None:
        message += f" (last error: {last_error!r})"
    if detail is not None:
        message += f"\n{detail()}"
    return AssertionError(message)


async def wait_until(predicate: Callable[[], Any], *, what: str = "condition",
                     timeout: float = 10.0, interval: float = 0.02,
                     tolerate: tuple[type[BaseException], ...] = (),
                     detail: Callable[[], str] | None = None) -> Any:
    """The first truthy value of `predicate()` (sync or async), polled every
    `interval` s; errors of the `tolerate` types count as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except tolerate as exc:
            last_error = exc
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, last_error, detail)
        await asyncio.sleep(interval)


def wait_until_sync(predicate: Callable[[], Any], *, what: str = "condition",
                    timeout: float = 10.0, interval: float = 0.05,
                    tolerate: tuple[type[BaseException], ...] = (),
                    detail: Callable[[], str] | None = None) -> Any:
    """wait_until for code without an event loop (blocks the thread between polls)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except tolerate as exc:
            last_error = exc
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, last_error, detail)
        time.sleep(interval)


async def wait_status(store: Any, execution_id: str, *statuses: str,
                      timeout: float = 10.0) -> dict:
    """The record once its (healed) status is one of `statuses`; a timeout
    names the last status, outcome and token seen."""
    last: dict[str, Any] = {}

    async def check() -> dict | None:
        record = await store.history.get(execution_id)
        last["record"] = record
        return record if record is not None and record["status"] in statuses else None

    def seen() -> str:
        record = last.get("record") or {}
        return (f"last status {record.get('status')!r}, outcome {record.get('outcome')!r}, "
                f"token {record.get('token')!r}")

    return await wait_until(check, timeout=timeout, what=f"{execution_id} in {statuses}",
                            detail=seen)


async def wait_record(store: Any, execution_id: str, check: Callable[[dict], Any], *,
                      timeout: float = 10.0, interval: float = 0.05,
                      what: str = "condition") -> dict:
    """The record once `check(record)` holds; a timeout names the last status,
    parked reason and waiting_on seen."""
    last: dict[str, Any] = {}

    async def holds() -> dict | None:
        record = await store.history.get(execution_id)
        last["record"] = record
        return record if record is not None and check(record) else None

    def seen() -> str:
        record = last.get("record") or {}
        return (f"last status {record.get('status')!r}, parked_reason "
                f"{record.get('parked_reason')!r}, waiting_on {record.get('waiting_on')!r}")

    return await wait_until(holds, timeout=timeout, interval=interval,
                            what=f"{what} on {execution_id}", detail=seen)


async def wait_event(store: Any, execution_id: str, kind: str, *, count: int = 1,
                     timeout: float = 10.0) -> list[dict]:
    """The execution's events of `kind` once there are at least `count`."""
    async def check() -> list[dict] | None:
        found = [e for e in await store.history.events(execution_id) if e["kind"] == kind]
        return found if len(found) >= count else None

    return await wait_until(check, timeout=timeout,
                            what=f"{count} {kind!r} event(s) of {execution_id}")
