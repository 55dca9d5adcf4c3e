"""The workflow SDK: what workflow code imports.

    from app.sdk import workflow, WorkflowContext, RetryPolicy, Retry

A workflow is replayed from the top on every delivery. Each `ctx.step` whose
result is recorded returns it without running; the first unrecorded step runs
and is recorded through a fenced write. Step keys are chosen by the author and
must be stable across code versions: never derive them from a counter.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import random
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar

from app import tracing
from app.dberrors import is_database_failure, is_infrastructure, is_retryable_conflict
from app.metrics import METRICS
from app.queues import DEFAULT_QUEUE, Queue
from app.registry import ID_RE, SYSTEM_ID_SEPARATOR, WorkflowDefinition, workflow
from app.store import (
    Delivery,
    ExecutionStore,
    InvalidEvent,
    Lease,
    LeaseLost,
    StepRecord,
)
from app.store.compose import TransactionFailed
from app.store.signals import SignalSender, signal_function_name

log = logging.getLogger("fencepost.sdk")

T = TypeVar("T")

__all__ = [
    "workflow",
    "Queue",
    "WorkflowContext",
    "RetryPolicy",
    "Retry",
    "StepFailed",
    "SignalTimeout",
    "ReplayError",
    "Nondeterminism",
    "Cancelled",
    "DeadlineExceeded",
    "OutcomeUnknown",
    "NOT_FOUND",
    "ChildFailed",
    "StepTimeout",
    "ReceivedSignal",
    "SignalSender",  # the store's class itself: a sender reaches the store unconverted
]


# --------------------------------------------------------------------- answers


class Retry(Exception):  # noqa: N818 - a reply, named as the SDK spells it
    """Raise from workflow code to end this delivery without an outcome: the
    lease is released and the execution redelivered after the redelivery delay."""


class StepFailed(Exception):
    """A step exhausted its attempts (now, or in an earlier delivery: the
    failure is recorded and replayed identically)."""

    def __init__(self, step_key: str, error: dict[str, Any]):
        self.step_key = step_key
        self.error_name = error.get("name", "Error")
        self.error_message = error.get("message", "")
        super().__init__(f"step {step_key!r} failed: {self.error_name}: {self.error_message}")


class StepTimeout(Exception):
    """An attempt of a step ran longer than its timeout (`ctx.step(timeout=)`
    or `@workflow(step_timeout=)`). Raised into the step's retry policy like any
    failure. An async function is cancelled; a sync function's thread cannot be
    killed, so it is abandoned: its late result is kept only as a late
    observation."""

    def __init__(self, step_key: str, seconds: float):
        self.step_key = step_key
        self.seconds = seconds
        super().__init__(f"step {step_key!r} did not finish within {seconds:g} s")


class SignalTimeout(TimeoutError):
    def __init__(self, name: str, step_key: str):
        self.signal_name = name
        self.step_key = step_key
        super().__init__(f"no signal {name!r} arrived in time (step {step_key!r})")


@dataclass(frozen=True)
class ReceivedSignal:
    """What `wait_for_signal(..., with_sender=True)` returns."""

    payload: Any
    sender: SignalSender | None

    @classmethod
    def from_recorded(cls, value: Any) -> ReceivedSignal:
        value = value if isinstance(value, dict) else {}
        sender = value.get("sender")
        return cls(
            value.get("payload"),
            # The store writes all three keys (tokenId null without authentication).
            SignalSender(sender["tokenId"], sender["name"], sender["role"])
            if isinstance(sender, dict) else None,
        )


class ReplayError(Exception):
    """A defect of the code whatever the history: a step key used twice in
    one run, or an empty or non-string key. The execution fails loudly.
    (Code that no longer fits its history raises Nondeterminism instead.)"""


class Nondeterminism(BaseException):  # noqa: N818 - named for what happened
    """The code no longer fits the execution's recorded history: at some
    point it asks for a step other than the one recorded there (steps
    inserted, removed or reordered), or under a key recorded by another
    function, or returns or raises before a recorded step. The execution is parked
    (reason `nondeterminism`, `divergence` shown) rather than failed or run
    down a new branch; deploy code that fits, or move it to a version that
    does, and it resumes. A BaseException, and latched like Suspend: workflow
    code cannot swallow it, and no later ctx call of this delivery runs."""

    def __init__(self, divergence: dict[str, Any]):
        self.divergence = divergence
        super().__init__(divergence["message"])


def divergence(position: int | None, recorded: str | None, asked: str | None,
               message: str) -> dict[str, Any]:
    """The first point where code and history disagree, as shown to operators."""
    return {"position": position, "recorded": recorded, "asked": asked, "message": message}


class Suspend(BaseException):
    """Internal: the delivery acknowledges `suspended` (sleep, signal wait).
    A BaseException so `except Exception` in workflow code cannot swallow it;
    once raised, every later ctx call raises it again, so a `finally:` block
    runs no step while the code suspends (it runs when the code really ends)."""


class Cancelled(BaseException):  # noqa: N818 - named for what happened
    """Raised into workflow code at its next step once a cancel was requested.
    Catch it (or use try/finally) to run cleanup steps, recorded as usual;
    the execution then ends `cancelled` whatever the code returns."""


class DeadlineExceeded(BaseException):  # noqa: N818
    """Raised into workflow code once the execution's deadline has passed (or
    a sleep would end after it); the execution ends `timed_out`."""


class ChildFailed(Exception):  # noqa: N818
    """A child workflow ended without completing (failed, cancelled or
    timed out); carries the child's error name and message."""

    def __init__(self, child_id: str, status: str, error: dict[str, Any]):
        self.child_id = child_id
        self.child_status = status
        self.error_name = error.get("name", "Error")
        self.error_message = error.get("message", "")
        super().__init__(
            f"child {child_id!r} ended {status}: {self.error_name}: {self.error_message}"
        )


class OutcomeUnknown(Exception):  # noqa: N818
    """Raise from an effect's function when the remote call may or may not
    have happened (a timeout after sending, a dropped connection). fencepost
    then treats the attempt as in doubt and never guesses."""


class _NotFound:
    def __repr__(self) -> str:
        return "NOT_FOUND"


# What a `reconcile` function returns when the remote side has no record of
# the request: the call may then be made (again) with the same key.
NOT_FOUND: Any = _NotFound()


class Park(BaseException):
    """Internal: an effect's outcome is unknown; park the execution."""

    def __init__(self, step_key: str):
        super().__init__(f"effect {step_key!r}: outcome unknown")
        self.step_key = step_key


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



# An error message is kept whole up to this many characters (a bound, so an
# exception carrying a huge payload cannot make the outcome unstorable).
ERROR_MESSAGE_CHARS = 4000


def error_of(exc: BaseException) -> dict[str, Any]:
    message = str(exc)
    if len(message) > ERROR_MESSAGE_CHARS:
        message = message[:ERROR_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return {"name": type(exc).__name__, "message": message}


def _function_name(fn: Callable[..., Any]) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    name: str = getattr(target, "__qualname__", None) or type(target).__name__
    return name


def json_problem(value: Any) -> str | None:
    """Why `value` is not a JSON value Postgres can store exactly, or None."""
    problem = value_problem(value, None)
    return problem[1] if problem else None


def value_problem(value: Any, max_bytes: int | None) -> tuple[str, str] | None:
    """(kind, why) when `value` cannot be recorded: kind "not-json" (not a JSON
    value Postgres can store exactly) or "too-large" (its JSON is over
    `max_bytes`, FENCEPOST_MAX_PAYLOAD_BYTES); None when it can."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return "not-json", str(exc)
    if max_bytes is not None and len(encoded) > max_bytes // 4 and (
        size := len(encoded.encode())
    ) > max_bytes:
        return "too-large", (f"its JSON is {size} bytes, over the limit of {max_bytes} "
                             "(FENCEPOST_MAX_PAYLOAD_BYTES); store large data elsewhere "
                             "and record a reference")
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
        workflows: dict[str, WorkflowDefinition] | None = None,
        *,
        max_payload_bytes: int | None = None,
    ):
        self._store = store
        self._workflows = workflows or {}
        self._delivery = delivery
        self._lease = delivery.lease
        self._steps = dict(steps)
        self._used: set[str] = set()
        # Replays compare the code's order of asks with the recorded one: the
        # n-th ask of the workflow's own task must be the step recorded at
        # position n. Asks from other tasks (a gather's branches) interleave
        # by timing, not by code, so they are neither numbered nor compared
        # by position, and the numbering of the workflow task's own asks does
        # not depend on them.
        self._asks = 0
        self._positions: dict[str, int | None] = {}
        self._recorded_at: dict[int, str] = {
            r.position: k for k, r in steps.items() if r.position is not None}
        self._history = frozenset(steps)
        self.diverged: dict[str, Any] | None = None
        # Each patch's decision in this run (a patched loop body asks again).
        self._patches: dict[str, bool] = {}
        try:
            self._task: asyncio.Task[Any] | None = asyncio.current_task()
        except RuntimeError:
            self._task = None
        self.execution_id: str = delivery.lease.execution_id
        self.workflow_id: str = definition.workflow_id
        self.params = params
        self.context = MappingProxyType(dict(delivery.context or {}))
        # Deliveries so far, this one included: every claim increments the token.
        self.attempt: int = delivery.lease.token
        self.deadline: datetime | None = delivery.deadline
        self.suspended_on: dict[str, Any] | None = None
        # "cancel" / "deadline", known at the claim (a cleanup delivery) or
        # learned from a fenced write or a renewal; raised into the workflow
        # once, at its first call that is not a replay (the frontier), and
        # again at any wait after that (cleanup cannot wait).
        self.interrupt: str | None = delivery.interrupt
        self._interrupt_raised = False
        # The latch: once set (the lease was lost, the database failed, the
        # worker stopped the delivery), every ctx call raises DeliveryStopped
        # before running anything, `finally:` blocks included.
        self.stopped: str | None = None
        self.lease_lost = False
        self._max_payload_bytes = max_payload_bytes
        self._step_timeout = definition.step_timeout
        # Keyless waits for each signal name in this run, in code order: the
        # n-th gets the key `signal:{name}#n` (the first `signal:{name}`).
        self._signal_waits: dict[str, int] = {}

    def notice(self, interrupt: str | None) -> None:
        """Record an interrupt (from a fenced write's answer or a renewal)."""
        if interrupt and self.interrupt is None:
            self.interrupt = interrupt

    def stop(self, reason: str, *, lease_lost: bool = False) -> None:
        """Latch the delivery stopped: no user function runs and no write is
        sent for it from now on."""
        if self.stopped is None:
            self.stopped = reason
        self.lease_lost = self.lease_lost or lease_lost

    def _traced(self, key: str, attempt: int) -> dict[str, Any]:
        """A step span's attributes."""
        return {"fencepost.execution_id": self.execution_id, "fencepost.step_key": key,
                "fencepost.attempt": attempt, "fencepost.token": self._lease.token}

    def _live(self) -> None:
        """At every ctx call, replays included: stop if the delivery is
        stopped; keep suspending if it is suspending (a `finally:` or a
        concurrent branch runs nothing on the way out)."""
        if self.stopped is not None:
            raise DeliveryStopped(self.stopped)
        if self.diverged is not None:
            raise Nondeterminism(self.diverged)
        if self.suspended_on is not None:
            raise Suspend("the delivery is suspending")

    def _suspend(self, on: dict[str, Any], why: str) -> NoReturn:
        """End this delivery `suspended`, waiting on `on` (the first wait to
        suspend stands)."""
        self._gate(wait=True)
        if self.suspended_on is None:
            self.suspended_on = on
        raise Suspend(why)

    def _gate(self, *, wait: bool = False) -> None:
        """Before anything new runs (the frontier): stop if the delivery is
        stopped; raise a pending cancel or deadline into the workflow, once -
        or again, at a wait (`wait`): cleanup code cannot wait."""
        self._live()
        if self.interrupt and (wait or not self._interrupt_raised):
            self._interrupt_raised = True
            if self.interrupt == "cancel":
                raise Cancelled("cancellation was requested")
            raise DeadlineExceeded("the execution's deadline has passed")

    # ------------------------------------------------------------------ steps

    async def step(self, key: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
                   timeout: float | timedelta | None = None, **kwargs: Any) -> Any:
        """Run `fn` once and record its JSON result; on replay return the record.
        `timeout` (default: the workflow's `step_timeout`) bounds each attempt:
        an attempt that overruns raises StepTimeout into the retry policy."""
        self._live()
        name = _function_name(fn)
        recorded = self._take(key, name)
        if recorded is not None:
            return self._replay(recorded)
        self._gate()
        policy = retry or NO_RETRY
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if limit is None:
            limit = self._step_timeout
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                with tracing.span(f"fencepost step {key}", attributes=self._traced(key, attempt)):
                    value = await self._attempt(key, fn, args, kwargs, limit)
            except Retry:
                raise
            except Exception as exc:
                METRICS.step_seconds.labels(self.workflow_id).observe(time.perf_counter() - started)
                if await self._may_retry(key, name, attempt, exc, policy, attempt):
                    continue
                return self._settled(await self._record(key, name, attempt, error=error_of(exc)))
            METRICS.step_seconds.labels(self.workflow_id).observe(time.perf_counter() - started)
            return self._settled(await self._record_value(key, name, attempt, value))

    async def _attempt(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any], limit: float | None) -> Any:
        """One call of a step function, bounded by `limit` seconds (StepTimeout)."""
        if limit is None:
            return await _call(fn, args, kwargs)
        if inspect.iscoroutinefunction(fn):
            try:
                async with asyncio.timeout(limit) as bound:
                    return await fn(*args, **kwargs)
            except TimeoutError:
                if bound.expired():
                    raise StepTimeout(key, limit) from None
                raise  # the function's own TimeoutError
        # A thread cannot be killed: past the limit it is abandoned, and what
        # it returns later is kept only as a late observation.
        run = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        thread = asyncio.get_running_loop().run_in_executor(None, run)
        done, _ = await asyncio.wait({thread}, timeout=limit)
        if not done:
            thread.add_done_callback(functools.partial(self._abandoned_step_ended, key))
            raise StepTimeout(key, limit)
        value = thread.result()
        if inspect.isawaitable(value):
            value = await value
        return value

    def _abandoned_step_ended(self, key: str, thread: asyncio.Future[Any]) -> None:
        if thread.cancelled():
            return
        exc = thread.exception()
        value, error = (None, error_of(exc)) if exc is not None else (thread.result(), None)
        _in_background(self._observe_late(key, value, error))

    async def effect(self, key: str, fn: Callable[..., Any], *args: Any,
                     idempotency_key: str | None = None,
                     idempotent: bool = False, reconcile: Callable[[str], Any] | None = None,
                     transport_errors_unknown: bool = True, retry: RetryPolicy | None = None,
                     **kwargs: Any) -> Any:
        """Call something outside the database whose outcome must not be
        guessed. The attempt and its request identity (`idempotency_key`,
        default "{execution_id}:{key}") are persisted before `fn` is called as
        `fn(*args, idempotency_key=KEY, **kwargs)`; the result is recorded as
        step `key`. A later delivery that finds the attempt begun but no
        result calls again with the same key if `idempotent`, asks
        `reconcile(KEY)` (which returns the result, or NOT_FOUND) if given,
        and otherwise parks the execution until an operator resolves the step.
        Raise OutcomeUnknown from `fn` when it cannot tell what happened.
        A transport error (OSError, ConnectionError, TimeoutError) raised by
        `fn` is an unknown outcome too — the request may have reached the
        remote side — unless `transport_errors_unknown=False`; any other
        exception is the remote side's known answer (a failed step); with
        `retry=RetryPolicy(...)` such a known failure is retried by the policy
        with the same idempotency key before the step fails."""
        self._live()
        name = _function_name(fn)
        recorded = self._take(key, name)
        if recorded is not None:
            return self._replay(recorded)
        self._gate()
        wanted = idempotency_key or f"{self.execution_id}:{key}"
        attempt = await self._fenced(
            self._store.effects.begin_effect(self._lease, key, idempotency_key=wanted, function_name=name),
            key,
        )
        self.notice(attempt.interrupt)
        self._gate()  # cancelled or past the deadline: do not call out
        ikey = attempt.idempotency_key  # the identity first persisted stands
        attempts = attempt.attempts
        if not attempt.fresh:
            # An earlier delivery called out and recorded nothing: in doubt.
            if attempt.status == "retry" or idempotent:
                pass  # an operator said so, or the remote side deduplicates
            elif reconcile is not None:
                found = await _call(reconcile, (ikey,), {})
                if found is not NOT_FOUND:
                    return self._settled(await self._record_value(key, name, attempts, found))
            else:
                raise Park(key)
            await self._fenced(self._store.effects.retry_effect(self._lease, key), key)
            attempts += 1
        policy = retry or NO_RETRY
        tries = 0
        while True:
            tries += 1
            call = asyncio.ensure_future(_call(fn, args, {**kwargs, "idempotency_key": ikey}))
            try:
                # Shielded: if the delivery is stopped mid-call, what the remote
                # side answers is still kept (see _effect_answer_after_stop).
                with tracing.span(f"fencepost effect {key}",
                                  attributes={**self._traced(key, attempts),
                                              "fencepost.idempotency_key": ikey}):
                    value = await asyncio.shield(call)
            except asyncio.CancelledError:
                await self._effect_answer_after_stop(key, name, attempts, call,
                                                     transport_errors_unknown)
                raise
            except Retry:
                raise
            except Exception as exc:
                if _outcome_unknown(exc, transport_errors_unknown):
                    if idempotent or reconcile is not None:
                        raise Retry(f"effect {key!r}: outcome unknown; the next delivery "
                                    "settles it") from None
                    raise Park(key) from None
                # The remote side answered with an error: a known outcome,
                # retried with the same key while the policy says so.
                if await self._may_retry(key, name, attempts, exc, policy, tries):
                    await self._fenced(self._store.effects.retry_effect(self._lease, key), key)
                    attempts += 1
                    continue
                return self._settled(await self._record(key, name, attempts,
                                                        error=error_of(exc)))
            return self._settled(await self._record_value(key, name, attempts, value))

    async def transaction(self, key: str, fn: Callable[..., Awaitable[Any]], *args: Any,
                          retry: RetryPolicy | None = None) -> Any:
        """Run `await fn(conn, *args)` inside the very transaction that checks
        this delivery's token and records the step's receipt: the function's
        writes and the receipt commit together or not at all, and a stale
        holder is rolled back (LeaseLost) before it can commit anything. On
        replay the recorded result is returned and `fn` does not run. This is
        the exactly-once path for data in fencepost's own Postgres."""
        self._live()
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"transaction {key!r}: fn must be an async function taking a connection")
        name = _function_name(fn)
        recorded = self._take(key, name)
        if recorded is not None:
            return self._replay(recorded)
        self._gate()
        policy = retry or NO_RETRY
        attempt = conflicts = 0
        while True:
            attempt += 1
            try:
                with tracing.span(f"fencepost transaction {key}",
                                  attributes=self._traced(key, attempt)):
                    record = await self._fenced(
                        self._store.compose.transaction_step(self._lease, key, fn, args,
                                                     function_name=name, attempts=attempt,
                                                     check_value=self._value_problem,
                                                     position=self._positions.get(key)),
                        key,
                    )
            except TransactionFailed as failed:
                exc = failed.cause
                if is_retryable_conflict(exc) and conflicts < TRANSACTION_CONFLICT_RETRIES:
                    # The user's own SQL met a serialization failure or a
                    # deadlock: the transaction rolled back whole; run it again.
                    conflicts += 1
                    await asyncio.sleep(random.uniform(0.005, 0.05) * conflicts)
                    self._gate()
                    continue
                if is_database_failure(exc) and not is_retryable_conflict(exc):
                    self.stop(f"database unavailable at step {key!r}: {exc}")
                    raise DeliveryStopped(self.stopped) from exc
                if await self._may_retry(key, name, attempt, exc, policy, attempt - conflicts):
                    continue
                return self._settled(await self._record(key, name, attempt, error=error_of(exc)))
            except InvalidEvent as exc:
                error = {"name": "StepResultNotJSON", "message": str(exc)}
                return self._settled(await self._record(key, name, attempt, error=error))
            return self._settled(record)

    async def start_child(self, key: str, workflow_id: str, params: Any = None, *,
                          execution_id: str | None = None) -> str:
        """Admit a child execution once, whatever replays or stale holders do:
        its ID (default "{execution_id}~{key}": `~` is outside the client ID
        alphabet, so no client can admit it first) and the link to this step
        are the receipt. Returns the child's execution ID (a replay returns the
        recorded one, whatever form it was started under). An `execution_id`
        taken by an unrelated execution fails the step (StepFailed,
        ExecutionIdConflict)."""
        self._live()
        recorded = self._take(key, f"child:{workflow_id}")
        child: str  # the step's recorded value is the child's execution ID
        if recorded is not None:
            child = self._replay(recorded)
            return child
        self._gate()
        child_id = execution_id or f"{self.execution_id}{SYSTEM_ID_SEPARATOR}{key}"
        definition = self._workflows.get(workflow_id)
        child_params = params if params is not None else {}
        if definition is not None:
            definition.parse_params(child_params)
        answer, detail = await self._fenced(
            self._store.compose.start_child(
                self._lease, key, workflow_id=workflow_id,
                params=child_params, child_id=child_id,
                timeout_seconds=definition.timeout_seconds if definition is not None else None,
                queue=definition.queue.name if definition is not None else DEFAULT_QUEUE,
                concurrency_key=definition.key_of(child_params) if definition is not None else None,
                # The child's own workflow's version in this code (None when
                # this code does not carry it: then any worker may run it).
                code_version=definition.version if definition is not None else None,
            ),
            key,
        )
        if answer == "parent_cancelling":  # no child was started, not even in cleanup
            self.notice("cancel")
            self._interrupt_raised = True
            raise Cancelled("cancellation was requested; no child was started")
        if answer == "conflict":
            taken = ("was retired (deleted by retention) and is never reused"
                     if detail.status == "retired" else
                     f"already exists (status {detail.status}, workflow {detail.workflow_id})")
            error = {
                "name": "ExecutionIdConflict",
                "message": f"execution {child_id!r} {taken} and is not this step's child",
            }
            child = self._settled(await self._record(key, f"child:{workflow_id}", 1, error=error))
            return child
        # "existing": the child this step started before (under whatever ID) stands.
        started = detail.execution_id if answer == "existing" else child_id
        child = self._settled(await self._record(key, f"child:{workflow_id}", 1, value=started))
        return child

    async def wait_for_child(self, key: str, child_id: str) -> Any:
        """The child's result once it has ended (recorded as step `key`); the
        delivery suspends until then (the child's end wakes this execution).
        A child that failed, was cancelled or timed out raises ChildFailed.
        While it runs, a cancel or the deadline is raised here."""
        self._live()
        recorded = self._take(key, "child-wait")
        if recorded is None:
            self._gate()
            status, outcome = await self._fenced(self._store.compose.child_status(child_id), key)
            if status is None:
                error = {"name": "ChildNotFound", "message": f"no execution {child_id!r}"}
                recorded = await self._record(key, "child-wait", 1, error=error)
            elif status == "completed":
                # A completed execution's outcome, written with its status, is {"result": ...}.
                recorded = await self._record(key, "child-wait", 1,
                                              value=(outcome or {})["result"])
            elif status in ("failed", "cancelled", "timed_out"):
                error = {"name": "ChildFailed", "message": f"child {child_id!r} ended {status}",
                         "childStatus": status, "childError": (outcome or {}).get("error", {})}
                recorded = await self._record(key, "child-wait", 1, error=error)
            else:
                self._suspend({"child": child_id}, f"waiting for child {child_id!r}")
        self.notice(recorded.interrupt)
        self._steps[key] = recorded
        failure = recorded.error or {}
        if recorded.status == "failed" and failure.get("name") == "ChildFailed":
            raise ChildFailed(child_id, failure.get("childStatus", "failed"),
                              failure.get("childError") or {})
        return self._settled(recorded)

    async def sleep(self, key: str, duration: float | timedelta) -> None:
        """A durable timer: the wake time (database clock) is recorded as step
        `key`; the delivery suspends and a later one continues once it is due.
        A sleep that would end past the deadline ends at the deadline, with
        DeadlineExceeded raised here."""
        self._live()
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        if seconds < 0:
            raise ValueError(f"sleep {key!r}: duration must not be negative")
        await self._timer(key, delay=seconds)

    async def sleep_until(self, key: str, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError(f"sleep_until {key!r}: give a timezone-aware datetime")
        self._live()
        await self._timer(key, until=when)

    async def wait_for_signal(self, name: str, timeout: float | timedelta | None = None, *,
                              key: str | None = None, with_sender: bool = False) -> Any:
        """Return the payload of the oldest unconsumed signal `name`, consuming
        it through a fenced step (`key`, default `signal:{name}`). With no
        signal pending, the delivery suspends until one arrives; past
        `timeout`, raises SignalTimeout (recorded, so replays agree).
        `with_sender=True` returns a ReceivedSignal (.payload, .sender: who sent
        it, a SignalSender, or None for a signal stored before senders were
        recorded); the step records both, so replays return the same. A wait that
        reaches past the deadline ends at the deadline, with DeadlineExceeded
        raised here."""
        self._live()
        generated = key is None
        if key is None:
            n = self._signal_waits[name] = self._signal_waits.get(name, 0) + 1
            key = f"signal:{name}" if n == 1 else f"signal:{name}#{n}"
        fname = signal_function_name(name, with_sender)
        timer_key = f"{key}:timeout"
        recorded = self._take(key, fname, generated=generated)
        # A timeout timer an earlier delivery recorded was asked for right
        # after the wait: taken here, at that position, before anything can
        # be raised into the code (a cancel's cleanup asks come after it).
        timer = (self._take(timer_key, "sleep", generated=True)
                 if timer_key in self._steps else None)
        if recorded is None:
            self._gate()
            recorded = await self._fenced(
                self._store.signals.consume_signal(self._lease, key, name, with_sender=with_sender,
                                                   position=self._positions.get(key)), key)
        if recorded is not None:
            self.notice(recorded.interrupt)
            self._steps[key] = recorded
            return self._replay_signal(recorded, name, with_sender)
        wake_at = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            wake_at = await self._timer_due_at(timer_key, delay=seconds, generated=generated,
                                               taken=timer)
            if wake_at is None:  # the timeout has passed
                error = {"name": "SignalTimeout", "message": f"no signal {name!r} arrived in time"}
                return self._replay_signal(await self._record(key, fname, 1, error=error), name,
                                           with_sender)
        self._suspend({"signal": name, "until": wake_at}, f"waiting for signal {name!r}")

    # -------------------------------------------------------------- internals

    def _take(self, key: str, function_name: str, *, generated: bool = False) -> StepRecord | None:
        """Claim `key` for this run and return its record, if any. An author's
        key uses the alphabet of IDs, so it can be named in a URL (resolve)
        and never equals a key fencepost generates (those contain `#`)."""
        if not isinstance(key, str) or not key:
            raise ReplayError("a step key must be a non-empty string")
        if not generated and not ID_RE.match(key):
            raise ValueError(
                f"step key {key!r}: use 1-200 characters from A-Z a-z 0-9 . _ : - "
                "(the alphabet of IDs, so the step can be named in a URL)")
        if key in self._used:
            raise ReplayError(
                f"step key {key!r} is used twice in one run; give each step its own stable key"
            )
        self._used.add(key)
        position = self._ask(key)
        recorded = self._steps.get(key)
        if recorded is not None and recorded.function_name not in (None, function_name):
            self._diverge(divergence(
                position, key, key,
                f"step {key!r} was recorded by {recorded.function_name!r} but the code now "
                f"calls {function_name!r} under that key"))
        if position is None:
            return recorded
        there = self._recorded_at.get(position)
        moved = recorded is not None and recorded.position not in (None, position)
        if ((there is not None and there != key) or moved) \
                and self.interrupt and not self._interrupt_raised:
            # With a cancel or deadline pending and not raised yet, a history
            # that goes elsewhere from here is the cleanup that followed it
            # being raised at this point (at a step's write, or at a wait a
            # replay finds due): raise it here, as this ask never happened.
            self._unask(key)
            self._gate()
        if there is not None and there != key:
            self._diverge(divergence(
                position, there, key,
                f"at position {position} the history recorded step {there!r}, but the code "
                f"now asks for {key!r} there (a step was inserted, removed or reordered)"))
        if moved:
            assert recorded is not None and recorded.position is not None
            self._diverge(divergence(
                position, None, key,
                f"step {key!r} was recorded at position {recorded.position}, but the code now "
                f"reaches it at position {position} (steps before it were inserted, removed "
                "or reordered)"))
        return recorded

    def history_left(self) -> bool:
        """Whether steps recorded before this delivery remain that this run
        has not asked for yet: the history went further than the code has."""
        return any(k not in self._used for k in self._history)

    def _unask(self, key: str) -> None:
        """Take back the latest ask (`key`), as if the code never made it."""
        self._used.discard(key)
        if self._positions.pop(key, None) is not None:
            self._asks -= 1

    def _ask(self, key: str) -> int | None:
        """Number this ask in the code's order (None: from a concurrent branch)."""
        if self._task is not None and asyncio.current_task() is not self._task:
            self._positions[key] = None
            return None
        position = self._positions[key] = self._asks
        self._asks += 1
        return position

    def _diverge(self, found: dict[str, Any]) -> NoReturn:
        """Latch the first divergence and stop here: nothing new runs."""
        if self.diverged is None:
            self.diverged = found
        raise Nondeterminism(self.diverged)

    def divergence_at_end(self, raised: BaseException | None = None) -> dict[str, Any] | None:
        """When the code has ended (returned, or `raised`): the first recorded
        step it never asked for (by recorded position), as a divergence - the
        history went further than this code does; None when all were asked."""
        unreached = self.unreached_steps()
        if not unreached:
            return None
        first = min(unreached, key=lambda k: (self._steps[k].position is None,
                                              self._steps[k].position or 0, k))
        ended = "returned" if raised is None else f"raised {type(raised).__name__}"
        return divergence(
            self._steps[first].position, first, None,
            f"recorded steps {unreached} were not reached: the code {ended} without asking "
            f"for {first!r} (a step was removed, or is now skipped)")

    # ---------------------------------------------------------------- patches

    async def patched(self, change_id: str) -> bool:
        """Whether this execution takes the code path of patch `change_id`:
        True for an execution reaching this point for the first time under
        code that has the patch (the decision is recorded, so every replay
        says True again), False for one whose recorded history went past this
        point before the patch existed (it keeps the old path). Lifecycle:
        `if await ctx.patched("x"): new() else: old()`; once no execution
        without the decision is left, `ctx.deprecate_patch("x"); new()`; once
        none with it is left, plain `new()`."""
        self._live()
        key = _patch_key(change_id)
        if change_id in self._patches:  # asked again in this run: the same answer
            return self._patches[change_id]
        if key in self._steps:
            self._take(key, "patch", generated=True)
        elif self.history_left():
            self._patches[change_id] = False  # the history went past here without it
            return False
        else:
            self._take(key, "patch", generated=True)
            self._gate()
            self._settled(await self._record(key, "patch", 1, value=True))
        self._patches[change_id] = True
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """The patch's second stage: the code always takes the new path. An
        execution that recorded the decision still replays (its marker is
        taken here, so later steps keep their positions); nothing is recorded
        for new ones."""
        self._live()
        key = _patch_key(change_id)
        if key in self._steps and key not in self._used:
            self._take(key, "patch", generated=True)

    def unreached_steps(self) -> list[str]:
        """Recorded steps this run never reached (checked when the code returns)."""
        return sorted(k for k in self._steps if k not in self._used)

    def _replay(self, record: StepRecord) -> Any:
        self._steps[record.step_key] = record
        if record.status == "failed":
            raise StepFailed(record.step_key, record.error or {})
        return record.value

    async def _effect_answer_after_stop(self, key: str, name: str, attempts: int,
                                        call: asyncio.Future[Any], transport_errors_unknown: bool,
                                        wait: float = 10.0) -> None:
        """The delivery was stopped while an effect was in flight: wait
        (bounded) for the remote answer. While the lease still holds (the
        worker is shutting down) a known answer is recorded as the step, so
        the next delivery does not park an outcome this worker saw; once the
        lease is known lost it is only kept as a late observation."""
        error: dict[str, Any] | None
        try:
            value = await asyncio.wait_for(call, timeout=wait)
        except Exception as exc:  # noqa: BLE001 - any answer is evidence
            value, error = None, error_of(exc)
            unknown = _outcome_unknown(exc, transport_errors_unknown)
        else:
            error, unknown = None, False
        if not self.lease_lost and not unknown:
            try:
                if error is not None:
                    await self._record(key, name, attempts, error=error)
                else:
                    await self._record_value(key, name, attempts, value)
                return
            except DeliveryStopped:
                return  # lost after all: _fenced kept the answer as evidence
        await self._observe_late(key, value, error)

    async def _observe_late(self, key: str, value: Any, error: dict[str, Any] | None) -> None:
        """A call's answer (value or error, None included) kept as evidence."""
        await keep_late_observation(self._store, self._lease, key, value, error, observed=True)

    def _settled(self, record: StepRecord) -> Any:
        """A step just recorded: stop here if the write said so, else replay it."""
        self.notice(record.interrupt)
        self._gate()
        return self._replay(record)

    async def _record_attempt(self, key: str, attempt: int, exc: BaseException) -> None:
        """Keep a failed attempt in the step's history (fenced)."""
        try:
            await self._fenced(self._store.steps.record_attempt(self._lease, key, attempt,
                                                          error_of(exc)), key)
        except InvalidEvent:
            pass  # an error text Postgres cannot store: the step's own record says enough

    def _value_problem(self, value: Any) -> str | None:
        problem = value_problem(value, self._max_payload_bytes)
        return problem[1] if problem else None

    async def _record_value(self, key: str, name: str, attempts: int, value: Any) -> StepRecord:
        problem = value_problem(value, self._max_payload_bytes)
        if problem is not None:
            kind, why = problem
            error = {
                "name": "StepResultNotJSON" if kind == "not-json" else "StepResultTooLarge",
                "message": f"step {key!r} returned a value that cannot be recorded: {why}",
            }
            return await self._record(key, name, attempts, error=error)
        return await self._record(key, name, attempts, value=value)

    async def _may_retry(self, key: str, name: str, attempts: int, exc: BaseException,
                         policy: RetryPolicy, tried: int) -> bool:
        """After a failed attempt (kept in the step's history): True once the
        policy's delay has passed and another attempt may run; False when the
        policy gives up (the caller records the failure). A retry that would
        start at or after the deadline is not made: the failure is recorded
        and DeadlineExceeded raised."""
        await self._record_attempt(key, attempts, exc)
        if not policy.retries(exc, tried):
            return False
        if await self._retry_fits(key, policy.delay(tried)):
            return True
        await self._record(key, name, attempts, error=error_of(exc))
        self._retry_past_deadline(key)
        return False  # not reached: _retry_past_deadline raises

    async def _retry_fits(self, key: str, delay: float) -> bool:
        """Sleep before the next attempt; False (no sleep) when it would start
        at or after the deadline."""
        if self.deadline is not None:
            now = await self._fenced(self._store.clock.db_now(), key)
            if (now - self.deadline).total_seconds() + delay >= 0:
                return False
        await asyncio.sleep(delay)
        self._gate()
        return True

    def _retry_past_deadline(self, key: str) -> None:
        """A retry that would start at or after the deadline is not scheduled:
        the last attempt's failure stands recorded and the execution times out."""
        self.notice("deadline")
        self._interrupt_raised = True
        raise DeadlineExceeded(f"the retry of step {key!r} would start after the "
                               "execution's deadline")

    def _replay_signal(self, record: StepRecord, name: str, with_sender: bool = False) -> Any:
        if record.status == "failed":
            raise SignalTimeout(name, record.step_key)
        if with_sender:
            return ReceivedSignal.from_recorded(record.value)
        return record.value

    async def _record(self, key: str, function_name: str, attempts: int, *, value: Any = None,
                      error: dict[str, Any] | None = None) -> StepRecord:
        try:
            return await self._fenced(
                self._store.steps.write_step(
                    self._lease, key, value=value, error=error,
                    function_name=function_name, attempts=attempts,
                    position=self._positions.get(key),
                ),
                key,
                value=value,
                error=error,
                observed=True,
            )
        except InvalidEvent as exc:
            # \u0000 or a lone surrogate: jsonb cannot hold it. The step fails.
            bad = {"name": "StepResultNotJSON", "message": f"step {key!r}: {exc}"}
            return await self._record(key, function_name, attempts, error=bad)

    async def _fenced(self, write: Awaitable[T], key: str, *, value: Any = None,
                      error: dict[str, Any] | None = None, observed: bool = False) -> T:
        """Await a store call. A lost lease latches the delivery stopped and
        keeps the step's result (`observed`: value / error are one) as
        evidence; a database failure (judged by SQLSTATE class) latches it
        too, and never reaches workflow code as an ordinary exception."""
        try:
            return await write
        except LeaseLost:
            METRICS.fenced_writes_rejected.inc()
            METRICS.leases_lost.inc()
            log.warning("write of step %r of %s (token %d) rejected: a newer token holds it",
                        key, self._lease.execution_id, self._lease.token,
                        extra={"kind": "fenced_write_rejected", "write": f"step {key}",
                               "execution_id": self._lease.execution_id,
                               "token": self._lease.token})
            self.stop(f"lease lost at step {key!r}", lease_lost=True)
            await keep_late_observation(self._store, self._lease, key, value, error,
                                        observed=observed)
            raise DeliveryStopped(self.stopped) from None
        except asyncio.CancelledError:
            # Stopped mid-write because a renewal found the lease lost: what
            # the step produced is still kept, as evidence.
            if self.lease_lost and observed:
                await self._observe_late(key, value, error)
            raise
        except Exception as exc:
            if not is_infrastructure(exc):
                raise
            self.stop(f"database unavailable at step {key!r}: {exc}")
            raise DeliveryStopped(self.stopped) from exc

    async def _timer(self, key: str, *, delay: float | None = None,
                     until: datetime | None = None) -> None:
        wake_at = await self._timer_due_at(key, delay=delay, until=until)
        if wake_at is not None:
            self._suspend({"sleep": key, "until": wake_at},
                          f"sleeping until {wake_at.isoformat()}")

    async def _timer_due_at(self, key: str, *, delay: float | None = None,
                            until: datetime | None = None,
                            generated: bool = False,
                            taken: StepRecord | None = None) -> datetime | None:
        """Record (or read) timer `key`; None when it is due, else its wake time,
        for which a wake has been requested. Due-ness is judged on the
        database clock only. A timer still running is a wait: a pending cancel
        or deadline is raised here (and the suspension's acknowledgement makes
        the execution due at the deadline at the latest). `taken`: its record,
        when the caller already took it."""
        recorded = taken if taken is not None else self._take(key, "sleep", generated=generated)
        if recorded is not None:
            wake_at = datetime.fromisoformat(recorded.value)
            if wake_at <= self._delivery.claimed_at:
                return None
            now = await self._fenced(self._store.clock.db_now(), key)
        else:
            # A new timer is a wait: cleanup code may not start one.
            self._gate(wait=True)
            wake_at, now, interrupt = await self._fenced(
                self._store.steps.record_timer(self._lease, key, delay_seconds=delay, until=until,
                                               position=self._positions.get(key)), key
            )
            self.notice(interrupt)
        if wake_at <= now:
            return None
        self._gate(wait=True)
        # Unfenced: a stale holder's extra wake costs at most one extra delivery.
        await self._fenced(self._store.operator.request_wake(self.execution_id, wake_at), key)
        return wake_at


def _patch_key(change_id: str) -> str:
    """The step recording a patch decision; `#` keeps it apart from author keys."""
    if not isinstance(change_id, str) or not ID_RE.match(change_id):
        raise ValueError(f"patch {change_id!r}: use 1-200 characters from A-Z a-z 0-9 . _ : -")
    return f"patch#{change_id}"


# Serialization failures and deadlocks of a transactional step's own SQL are
# retried this many times before they count as a failed attempt.
TRANSACTION_CONFLICT_RETRIES = 5

# Tasks nobody awaits (evidence of abandoned calls), kept from the collector.
_BACKGROUND: set[asyncio.Future[None]] = set()


def _in_background(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _outcome_unknown(exc: BaseException, transport_errors_unknown: bool) -> bool:
    """An effect function's exception that leaves its outcome in doubt."""
    return isinstance(exc, OutcomeUnknown) or (
        transport_errors_unknown and isinstance(exc, (OSError, TimeoutError))
    )


async def keep_late_observation(store: ExecutionStore, lease: Lease, key: str | None,
                                value: Any, error: dict[str, Any] | None, *,
                                observed: bool | None = None) -> None:
    """Keep what a stale, stopped or abandoned call answered, as evidence only
    (never applied), and count it; the store compares it with what was
    recorded, and a difference is an integrity conflict."""
    try:
        conflict = await store.steps.record_late_observation(lease, key, value=value, error=error,
                                                       observed=observed)
    except InvalidEvent:
        return
    except Exception as exc:
        if not is_infrastructure(exc):
            raise
        return
    METRICS.late_observations.inc()
    if conflict:
        METRICS.integrity_conflicts.inc()


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Await async functions; run sync ones in a thread so they cannot block
    the dispatcher's event loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    value = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
