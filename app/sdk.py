"""The workflow SDK: what workflow code imports.

    from app.sdk import workflow, WorkflowContext, RetryPolicy, Retry

A workflow is replayed from the top on every delivery. Each `ctx.step` whose
result is recorded returns it without running; the first unrecorded step runs
and is recorded through a fenced write. Step keys are chosen by the author and
must be stable across code versions: never derive them from a counter.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import asyncpg

from app.registry import WorkflowDefinition, workflow
from app.store import Delivery, ExecutionStore, InvalidEvent, LeaseLost, StepRecord

__all__ = [
    "workflow",
    "WorkflowContext",
    "RetryPolicy",
    "Retry",
    "StepFailed",
    "SignalTimeout",
    "ReplayError",
]


# --------------------------------------------------------------------- answers


class Retry(Exception):  # noqa: N818 - a reply, named as the SDK spells it
    """Raise from workflow code to end this delivery without an outcome: the
    lease is released and the execution redelivered after the redelivery delay."""


class StepFailed(Exception):
    """A step exhausted its attempts (now, or in an earlier delivery: the
    failure is recorded and replayed identically)."""

    def __init__(self, step_key: str, error: dict):
        self.step_key = step_key
        self.error_name = error.get("name", "Error")
        self.error_message = error.get("message", "")
        super().__init__(f"step {step_key!r} failed: {self.error_name}: {self.error_message}")


class SignalTimeout(TimeoutError):
    def __init__(self, name: str, step_key: str):
        self.signal_name = name
        self.step_key = step_key
        super().__init__(f"no signal {name!r} arrived in time (step {step_key!r})")


class ReplayError(Exception):
    """The code and the recorded history disagree (a duplicate step key, a key
    recorded by a different function, a recorded step the code no longer
    reaches). The execution fails loudly rather than guess."""


class Suspend(BaseException):
    """Internal: the delivery acknowledges `suspended` (sleep, signal wait).
    A BaseException so `except Exception` in workflow code cannot swallow it."""


class DeliveryStopped(BaseException):
    """Internal: the lease was lost or the database went away mid-delivery;
    the delivery stops with no acknowledgement and no further fenced write."""


# ----------------------------------------------------------------- retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a step inside one delivery, with capped exponential backoff."""

    max_attempts: int = 3
    initial_interval: float = 0.5
    backoff: float = 2.0
    max_interval: float = 30.0
    non_retryable: tuple[type[BaseException], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.initial_interval < 0 or self.backoff < 1:
            raise ValueError("RetryPolicy needs max_attempts >= 1, initial_interval >= 0, backoff >= 1")

    def delay(self, attempt: int) -> float:
        """Delay after failed attempt `attempt` (1-based), with ±10% jitter."""
        base = min(self.initial_interval * self.backoff ** (attempt - 1), self.max_interval)
        return base * random.uniform(0.9, 1.1)

    def retries(self, exc: BaseException, attempt: int) -> bool:
        return attempt < self.max_attempts and not isinstance(exc, self.non_retryable)


NO_RETRY = RetryPolicy(max_attempts=1)

# Errors that mean the database, not the workflow, failed: never an outcome.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.QueryCanceledError,
    asyncpg.TooManyConnectionsError,
)


def error_of(exc: BaseException) -> dict:
    return {"name": type(exc).__name__, "message": str(exc)}


def _function_name(fn: Callable) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    return getattr(target, "__qualname__", None) or type(target).__name__


def json_problem(value: Any) -> str | None:
    """Why `value` is not a JSON value Postgres can store exactly, or None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------- context


class WorkflowContext:
    """Handed to workflow code once per delivery."""

    def __init__(
        self,
        store: ExecutionStore,
        delivery: Delivery,
        steps: dict[str, StepRecord],
        definition: WorkflowDefinition,
        params: Any,
    ):
        self._store = store
        self._delivery = delivery
        self._lease = delivery.lease
        self._steps = dict(steps)
        self._used: set[str] = set()
        self.execution_id: str = delivery.lease.execution_id
        self.workflow_id: str = definition.workflow_id
        self.params = params
        self.context = MappingProxyType(dict(delivery.context or {}))
        # Deliveries so far, this one included: every claim increments the token.
        self.attempt: int = delivery.lease.token
        self.suspended_on: dict | None = None

    # ------------------------------------------------------------------ steps

    async def step(self, key: str, fn: Callable, *args: Any, retry: RetryPolicy | None = None,
                   **kwargs: Any) -> Any:
        """Run `fn` once and record its JSON result; on replay return the record."""
        name = _function_name(fn)
        recorded = self._take(key, name)
        if recorded is not None:
            return self._replay(recorded)
        policy = retry or NO_RETRY
        attempt = 0
        while True:
            attempt += 1
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(*args, **kwargs)
                else:  # sync work must not block the dispatcher's event loop
                    value = await asyncio.to_thread(fn, *args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
            except (Suspend, DeliveryStopped):
                raise
            except Exception as exc:
                if policy.retries(exc, attempt):
                    await asyncio.sleep(policy.delay(attempt))
                    continue
                return self._replay(await self._record(key, name, attempt, error=error_of(exc)))
            problem = json_problem(value)
            if problem is not None:
                error = {
                    "name": "StepResultNotJSON",
                    "message": f"step {key!r} returned a value that is not JSON: {problem}",
                }
                return self._replay(await self._record(key, name, attempt, error=error))
            return self._replay(await self._record(key, name, attempt, value=value))

    async def sleep(self, key: str, duration: float | timedelta) -> None:
        """A durable timer: the wake time (database clock) is recorded as step
        `key`; the delivery suspends and a later one continues once it is due."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        if seconds < 0:
            raise ValueError(f"sleep {key!r}: duration must not be negative")
        await self._timer(key, delay=seconds)

    async def sleep_until(self, key: str, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError(f"sleep_until {key!r}: give a timezone-aware datetime")
        await self._timer(key, until=when)

    async def wait_for_signal(self, name: str, timeout: float | timedelta | None = None, *,
                              key: str | None = None) -> Any:
        """Return the payload of the oldest unconsumed signal `name`, consuming
        it through a fenced step (`key`, default `signal:{name}`). With no
        signal pending, the delivery suspends until one arrives; past
        `timeout`, raises SignalTimeout (recorded, so replays agree)."""
        key = key or f"signal:{name}"
        fname = f"signal:{name}"
        timer_key = f"{key}:timeout"
        recorded = self._take(key, fname)
        if recorded is None:
            recorded = await self._fenced(self._store.consume_signal(self._lease, key, name), key)
        if recorded is not None:
            # The timeout timer, recorded by an earlier delivery, is settled too.
            if timer_key in self._steps:
                self._used.add(timer_key)
            self._steps[key] = recorded
            return self._replay_signal(recorded, name)
        wake_at = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            wake_at = await self._timer_due_at(timer_key, delay=seconds)
            if wake_at is None:  # the timeout has passed
                error = {"name": "SignalTimeout", "message": f"no signal {name!r} arrived in time"}
                return self._replay_signal(await self._record(key, fname, 1, error=error), name)
        self.suspended_on = {"signal": name, "until": wake_at}
        raise Suspend(f"waiting for signal {name!r}")

    # -------------------------------------------------------------- internals

    def _take(self, key: str, function_name: str) -> StepRecord | None:
        """Claim `key` for this run and return its record, if any."""
        if not isinstance(key, str) or not key:
            raise ReplayError("a step key must be a non-empty string")
        if key in self._used:
            raise ReplayError(
                f"step key {key!r} is used twice in one run; give each step its own stable key"
            )
        self._used.add(key)
        recorded = self._steps.get(key)
        if recorded is not None and recorded.function_name not in (None, function_name):
            raise ReplayError(
                f"step {key!r} was recorded by {recorded.function_name!r} but the code now calls "
                f"{function_name!r} under that key; the workflow code changed incompatibly"
            )
        return recorded

    def unreached_steps(self) -> list[str]:
        """Recorded steps this run never reached (checked when the code returns)."""
        return sorted(k for k in self._steps if k not in self._used)

    def _replay(self, record: StepRecord) -> Any:
        self._steps[record.step_key] = record
        if record.status == "failed":
            raise StepFailed(record.step_key, record.error or {})
        return record.value

    def _replay_signal(self, record: StepRecord, name: str) -> Any:
        if record.status == "failed":
            raise SignalTimeout(name, record.step_key)
        return record.value

    async def _record(self, key: str, function_name: str, attempts: int, *, value: Any = None,
                      error: dict | None = None) -> StepRecord:
        try:
            return await self._fenced(
                self._store.write_step(
                    self._lease, key, value=value, error=error,
                    function_name=function_name, attempts=attempts,
                ),
                key,
                value=value,
                error=error,
            )
        except InvalidEvent as exc:
            # \u0000 or a lone surrogate: jsonb cannot hold it. The step fails.
            bad = {"name": "StepResultNotJSON", "message": f"step {key!r}: {exc}"}
            return await self._record(key, function_name, attempts, error=bad)

    async def _fenced(self, write, key: str, *, value: Any = None, error: dict | None = None):
        """Await a fenced write; a lost lease leaves evidence and stops the delivery."""
        try:
            return await write
        except LeaseLost:
            try:
                await self._store.record_late_observation(self._lease, key, value=value, error=error)
            except INFRASTRUCTURE_ERRORS:
                pass
            raise DeliveryStopped(f"lease lost at step {key!r}") from None
        except INFRASTRUCTURE_ERRORS as exc:
            raise DeliveryStopped(f"database unavailable at step {key!r}: {exc}") from exc

    async def _timer(self, key: str, *, delay: float | None = None,
                     until: datetime | None = None) -> None:
        wake_at = await self._timer_due_at(key, delay=delay, until=until)
        if wake_at is not None:
            self.suspended_on = {"sleep": key, "until": wake_at}
            raise Suspend(f"sleeping until {wake_at.isoformat()}")

    async def _timer_due_at(self, key: str, *, delay: float | None = None,
                            until: datetime | None = None) -> datetime | None:
        """Record (or read) timer `key`; None when it is due, else its wake time,
        for which a wake has been requested. Due-ness is judged on the
        database clock only."""
        recorded = self._take(key, "sleep")
        if recorded is not None:
            wake_at = datetime.fromisoformat(recorded.value)
            if wake_at <= self._delivery.claimed_at:
                return None
            now = await self._fenced(self._store.db_now(), key)
        else:
            wake_at, now = await self._fenced(
                self._store.record_timer(self._lease, key, delay_seconds=delay, until=until), key
            )
        if wake_at <= now:
            return None
        # Unfenced: a stale holder's extra wake costs at most one extra delivery.
        await self._fenced(self._store.request_wake(self.execution_id, wake_at), key)
        return wake_at


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
