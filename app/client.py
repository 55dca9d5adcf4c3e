"""A Python client for the fencepost HTTP API, sync and async, on httpx.

    from app.client import Client, ExecutionFailed

    with Client("http://localhost:8000", token="fp_...") as fp:
        started = fp.start("charge-order", {"orderId": 42}, execution_id="order-42",
                           if_exists="return")
        try:
            receipt = fp.result(started.execution_id, timeout=300)
        except ExecutionFailed as exc:
            print(exc.error_name, exc.error_message)

`AsyncClient` has the same methods as coroutines (`list` is an async iterator).

Errors: every error answer of the API raises the class named after its code
(`ExecutionIdConflict` for EXECUTION_ID_CONFLICT, ...), a `FencepostError`
carrying `code`, `message`, `status_code` and the whole `error` object as
`details`. `result()` raises `ExecutionFailed` / `ExecutionCancelled` /
`ExecutionTimedOut` when the execution ended otherwise than completed, and
`WaitTimeout` when its own timeout passed first. A 503 (the database is
unavailable) is retried after its Retry-After, at most `retries_503` times
(a retried start is safe with an execution_id and if_exists="return").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

import httpx

__all__ = [
    "ANY_VERSION", "ERRORS_BY_CODE", "KEEP", "AsyncClient", "Client", "DatabaseUnavailable",
    "DeadlineInThePast", "ExecutionCancelled", "ExecutionChanged", "ExecutionEnded",
    "ExecutionFailed", "ExecutionIdConflict", "ExecutionNotEnded", "ExecutionRunning",
    "ExecutionNotFound", "ExecutionNotParked", "ExecutionTerminal", "ExecutionTimedOut",
    "ExecutionUnsuccessful", "FencepostError", "Forbidden", "HostNotAllowed", "InvalidCursor",
    "InvalidConcurrencyKey", "InvalidExecutionEvent", "InvalidParams", "InvalidQueueSettings",
    "InvalidRequest", "InvalidResolution", "QueueNotFound", "ReplayCheckFailed",
    "ReplayCheckUnavailable", "ReplayDiverges",
    "InvalidSchedule", "MalformedJson", "MethodNotAllowed", "NotFound", "PayloadTooLarge",
    "RateLimited", "RedriveNeedsFromStep", "RequestHeaderFieldsTooLarge", "RequestTimeout",
    "ReservedExecutionId", "SchemaOutOfDate", "ScheduleExists", "ScheduleNotFound", "Started", "StepNotFound",
    "StepNotOutcomeUnknown", "TooManyPendingSignals", "Unauthenticated", "UnknownQueryParameter",
    "UnsupportedMediaType", "WaitTimeout", "WorkflowNotFound",
]

History = list[dict[str, Any]]  # `list` is also a method name in the clients below
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "timed_out"})
MAX_WAIT_SECONDS = 60.0  # the server's bound on waitSeconds
MAX_RETRY_AFTER_SECONDS = 30.0


# ----------------------------------------------------------------- errors


class FencepostError(Exception):
    """An error answer of the API: `code` (stable), `message` (what to do)."""

    code: str = "HTTP_ERROR"

    def __init__(self, message: str, *, code: str | None = None, status_code: int | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status_code = status_code
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidRequest(FencepostError):
    code = "INVALID_REQUEST"


class MalformedJson(FencepostError):
    code = "MALFORMED_JSON"


class UnsupportedMediaType(FencepostError):
    code = "UNSUPPORTED_MEDIA_TYPE"


class PayloadTooLarge(FencepostError):
    code = "PAYLOAD_TOO_LARGE"


class RequestTimeout(FencepostError):
    code = "REQUEST_TIMEOUT"


class InvalidExecutionEvent(FencepostError):
    code = "INVALID_EXECUTION_EVENT"


class InvalidParams(FencepostError):
    code = "INVALID_PARAMS"


class InvalidCursor(FencepostError):
    code = "INVALID_CURSOR"


class UnknownQueryParameter(FencepostError):
    code = "UNKNOWN_QUERY_PARAMETER"


class InvalidResolution(FencepostError):
    code = "INVALID_RESOLUTION"


class ReservedExecutionId(FencepostError):
    code = "RESERVED_EXECUTION_ID"


class DeadlineInThePast(FencepostError):
    code = "DEADLINE_IN_THE_PAST"


class Unauthenticated(FencepostError):
    code = "UNAUTHENTICATED"


class Forbidden(FencepostError):
    code = "FORBIDDEN"


class NotFound(FencepostError):
    code = "NOT_FOUND"


class WorkflowNotFound(FencepostError):
    code = "WORKFLOW_NOT_FOUND"


class ExecutionNotFound(FencepostError):
    code = "EXECUTION_NOT_FOUND"


class StepNotFound(FencepostError):
    code = "STEP_NOT_FOUND"


class ExecutionIdConflict(FencepostError):
    code = "EXECUTION_ID_CONFLICT"


class ExecutionTerminal(FencepostError):
    code = "EXECUTION_TERMINAL"


class ExecutionNotParked(FencepostError):
    code = "EXECUTION_NOT_PARKED"


class StepNotOutcomeUnknown(FencepostError):
    code = "STEP_NOT_OUTCOME_UNKNOWN"


class ExecutionNotEnded(FencepostError):
    code = "EXECUTION_NOT_ENDED"


class RedriveNeedsFromStep(FencepostError):
    code = "REDRIVE_NEEDS_FROM_STEP"


class ExecutionEnded(FencepostError):
    code = "EXECUTION_ENDED"


class ExecutionRunning(FencepostError):
    """A delivery holds the execution: retry when it ends."""

    code = "EXECUTION_RUNNING"


class ExecutionChanged(FencepostError):
    """The execution changed while its history was checked: retry."""

    code = "EXECUTION_CHANGED"


class ReplayDiverges(FencepostError):
    """The target code does not fit the history; `details["divergence"]` says where."""

    code = "REPLAY_DIVERGES"


class ReplayCheckUnavailable(FencepostError):
    """The API does not carry the target version: check with `fencepost
    replay`, then move with force=True."""

    code = "REPLAY_CHECK_UNAVAILABLE"


class ReplayCheckFailed(FencepostError):
    code = "REPLAY_CHECK_FAILED"


class OperationNotFound(FencepostError):
    code = "OPERATION_NOT_FOUND"


class OperationFinished(FencepostError):
    code = "OPERATION_FINISHED"


class TooManyMatched(FencepostError):
    code = "TOO_MANY_MATCHED"


class ScheduleNotFound(FencepostError):
    code = "SCHEDULE_NOT_FOUND"


class ScheduleExists(FencepostError):
    code = "SCHEDULE_EXISTS"


class InvalidSchedule(FencepostError):
    code = "INVALID_SCHEDULE"


class QueueNotFound(FencepostError):
    code = "QUEUE_NOT_FOUND"


class InvalidQueueSettings(FencepostError):
    code = "INVALID_QUEUE_SETTINGS"


class InvalidConcurrencyKey(FencepostError):
    code = "INVALID_CONCURRENCY_KEY"


class MethodNotAllowed(FencepostError):
    code = "METHOD_NOT_ALLOWED"


class HostNotAllowed(FencepostError):
    code = "HOST_NOT_ALLOWED"


class RequestHeaderFieldsTooLarge(FencepostError):
    code = "REQUEST_HEADER_FIELDS_TOO_LARGE"


class SchemaOutOfDate(FencepostError):
    code = "SCHEMA_OUT_OF_DATE"


class RateLimited(FencepostError):
    code = "RATE_LIMITED"


class TooManyPendingSignals(FencepostError):
    code = "TOO_MANY_PENDING_SIGNALS"


class DatabaseUnavailable(FencepostError):
    code = "DATABASE_UNAVAILABLE"


ERRORS_BY_CODE: dict[str, type[FencepostError]] = {
    cls.code: cls for cls in (
        InvalidRequest, MalformedJson, UnsupportedMediaType, PayloadTooLarge, RequestTimeout,
        InvalidExecutionEvent, InvalidParams, InvalidCursor, UnknownQueryParameter,
        InvalidResolution,
        ReservedExecutionId, DeadlineInThePast, Unauthenticated, Forbidden, NotFound,
        WorkflowNotFound, ExecutionNotFound, StepNotFound, ExecutionIdConflict,
        ExecutionTerminal, ExecutionNotParked, StepNotOutcomeUnknown, ExecutionNotEnded,
        RedriveNeedsFromStep, ExecutionEnded, ExecutionRunning, ExecutionChanged,
        ReplayDiverges, ReplayCheckUnavailable, ReplayCheckFailed, OperationNotFound, OperationFinished, TooManyMatched,
        ScheduleNotFound, ScheduleExists, InvalidSchedule,
        QueueNotFound, InvalidQueueSettings, InvalidConcurrencyKey,
        MethodNotAllowed, HostNotAllowed, RequestHeaderFieldsTooLarge, SchemaOutOfDate, RateLimited,
        TooManyPendingSignals, DatabaseUnavailable,
    )
}


class ExecutionUnsuccessful(FencepostError):
    """The execution ended, but not completed: `record` is its final record,
    `error_name` / `error_message` its outcome's error."""

    def __init__(self, record: dict[str, Any]) -> None:
        error = ((record.get("outcome") or {}).get("error")) or {}
        self.execution_id: str = record["executionId"]
        self.record = record
        self.error_name: str | None = error.get("name")
        self.error_message: str | None = error.get("message")
        super().__init__(
            f"execution {self.execution_id!r} ended {record['status']}"
            + (f": {self.error_name}: {self.error_message}" if self.error_name else ""),
            details={"status": record["status"], "error": error},
        )


class ExecutionFailed(ExecutionUnsuccessful):
    code = "EXECUTION_FAILED"


class ExecutionCancelled(ExecutionUnsuccessful):
    code = "EXECUTION_CANCELLED"


class ExecutionTimedOut(ExecutionUnsuccessful):
    code = "EXECUTION_TIMED_OUT"


_UNSUCCESSFUL: dict[str, type[ExecutionUnsuccessful]] = {
    "failed": ExecutionFailed, "cancelled": ExecutionCancelled, "timed_out": ExecutionTimedOut,
}


class WaitTimeout(FencepostError, TimeoutError):
    """`result(timeout=...)` passed before the execution ended; `record` is
    the last one read. The execution goes on: wait again, or cancel it."""

    code = "WAIT_TIMEOUT"

    def __init__(self, record: dict[str, Any], timeout: float) -> None:
        self.execution_id: str = record["executionId"]
        self.record = record
        super().__init__(f"execution {self.execution_id!r} is still {record['status']} after "
                         f"{timeout:g} s")


def error_from(response: httpx.Response) -> FencepostError:
    """The exception for an error answer, by its code."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return FencepostError(f"HTTP {response.status_code}: {response.text[:500]}",
                              code=f"HTTP_{response.status_code}",
                              status_code=response.status_code)
    cls = ERRORS_BY_CODE.get(code, FencepostError)
    return cls(message, code=code, status_code=response.status_code, details=error)


def _body(response: httpx.Response) -> dict[str, Any]:
    """A success answer's JSON object."""
    body = response.json()
    if not isinstance(body, dict):
        raise FencepostError(f"expected a JSON object, got: {response.text[:200]}",
                             code="UNEXPECTED_RESPONSE", status_code=response.status_code)
    return body


def outcome_of(record: dict[str, Any]) -> Any:
    """The result of a completed record; the exception for another end."""
    if record["status"] == "completed":
        return (record.get("outcome") or {}).get("result")
    raise _UNSUCCESSFUL[record["status"]](record)


@dataclass(frozen=True)
class Started:
    """What `start` answers: `created` is False when `if_exists="return"`
    found the same admission made before (`record` is then its record)."""

    execution_id: str
    status: str
    created: bool
    record: dict[str, Any] | None = None


# --------------------------------------------------------- shared plumbing


def _path(*parts: str) -> str:
    return "/v1/executions" + "".join("/" + quote(p, safe="") for p in parts)


def _admission(workflow_id: str, params: Any, execution_id: str | None, if_exists: str,
               timeout_seconds: float | None, deadline: datetime | str | None,
               context: Mapping[str, Any] | None, flow: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"workflowId": workflow_id,
                            "params": {} if params is None else params, **flow}
    if execution_id is not None:
        body["executionId"] = execution_id
    if if_exists != "error":
        body["ifExists"] = if_exists
    if timeout_seconds is not None:
        body["timeoutSeconds"] = float(timeout_seconds)
    if deadline is not None:
        body["deadline"] = deadline.isoformat() if isinstance(deadline, datetime) else deadline
    if context is not None:
        body["context"] = dict(context)
    return body


def _flow(priority: int | None, start_at: datetime | str | None, delay_seconds: float | None,
          concurrency_key: str | None) -> dict[str, Any]:
    """Admission's flow-control fields, those given."""
    return _without_none(
        priority=priority,
        startAt=start_at.isoformat() if isinstance(start_at, datetime) else start_at,
        delaySeconds=float(delay_seconds) if delay_seconds is not None else None,
        concurrencyKey=concurrency_key)


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


# A queue setting not given to set_queue: left as it is (None means no limit).
KEEP: Any = _Keep()


class _AnyVersion:
    def __repr__(self) -> str:
        return "ANY_VERSION"


# move_versions' from_version not given: executions of any version (None:
# only unversioned ones).
ANY_VERSION: Any = _AnyVersion()


def _version_move(to: str | None, force: bool, reason: str | None) -> dict[str, Any]:
    return {"to": to, "force": force, **_without_none(reason=reason)}


def _versions_move(to: str | None, workflow_id: str, from_version: Any,
                   statuses: Sequence[str] | None, ids: Sequence[str] | None, limit: int | None,
                   force: bool, dry_run: bool, reason: str | None) -> dict[str, Any]:
    """move_versions' arguments as the request body."""
    selection: dict[str, Any] = {"workflowId": workflow_id}
    if from_version is not ANY_VERSION:
        selection["fromVersion"] = from_version
    if statuses is not None:
        selection["status"] = list(statuses)
    if ids is not None:
        selection["ids"] = list(ids)
    return {"to": to, "filter": selection, "force": force, "dryRun": dry_run,
            **_without_none(limit=limit, reason=reason)}


def _queue_path(name: str, *rest: str) -> str:
    return "/v1/queues/" + "/".join(quote(p, safe="") for p in (name, *rest))


def _queue_change(concurrency: Any, per_key_concurrency: Any, rate_limit: Any,
                  rate_per_key: Any, hold_while_suspended: Any, paused: Any,
                  reset: Sequence[str]) -> dict[str, Any]:
    """set_queue's arguments as the PUT body: rate_limit is (starts,
    period_seconds) or None; rate_per_key goes with it."""
    body: dict[str, Any] = {}
    for wire, value in (("concurrency", concurrency), ("perKeyConcurrency", per_key_concurrency),
                        ("holdWhileSuspended", hold_while_suspended), ("paused", paused)):
        if value is not KEEP:
            body[wire] = value
    if rate_limit is not KEEP:
        if rate_limit is None:
            body["rateLimit"] = None
        else:
            limit, period = rate_limit
            body["rateLimit"] = {"limit": limit, "periodSeconds": float(period),
                                 "perKey": bool(rate_per_key) if rate_per_key is not KEEP
                                 else False}
    elif rate_per_key is not KEEP:
        raise ValueError("rate_per_key goes with rate_limit=(starts, period_seconds)")
    if reset:
        body["reset"] = list(reset)
    return body


def _started(response: httpx.Response) -> Started:
    body = _body(response)
    created = response.status_code == 201
    return Started(body["executionId"], body["status"], created, None if created else body)


def _query(filters: Mapping[str, Any]) -> dict[str, Any]:
    """list() filters in Python spelling (workflow_id=...) as query parameters."""
    out: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None:
            continue
        head, *rest = name.split("_")
        key = head + "".join(w.capitalize() for w in rest)
        out[key] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _without_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.0),
                   MAX_RETRY_AFTER_SECONDS)
    except ValueError:
        return 1.0


def _wait_for(timeout: float | None, started: float) -> float | None:
    """The next waitSeconds, or None when `timeout` has passed."""
    if timeout is None:
        return MAX_WAIT_SECONDS
    left = timeout - (time.monotonic() - started)
    return min(left, MAX_WAIT_SECONDS) if left > 0 else None


# ------------------------------------------------------------------ sync


class Client:
    """`Client(base_url, token=None, timeout=30.0)`: timeout is per request
    (a long-poll adds its waitSeconds to it). Extra keyword arguments go to
    `httpx.Client` (e.g. `transport=`, `verify=`)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, *,
                 retries_503: int = 3, **httpx_options: Any) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.retries_503 = retries_503
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout,
                                  **httpx_options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, ok: tuple[int, ...] = (200,),
              **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries_503 + 1):
            response = self._http.request(method, path, **kwargs)
            if response.status_code != 503 or attempt == self.retries_503:
                break
            time.sleep(_retry_after(response))
        if response.status_code not in ok:
            raise error_from(response)
        return response

    def start(self, workflow_id: str, params: Any = None, *, execution_id: str | None = None,
              if_exists: Literal["error", "return"] = "error",
              timeout_seconds: float | None = None, deadline: datetime | str | None = None,
              context: Mapping[str, Any] | None = None, priority: int | None = None,
              start_at: datetime | str | None = None, delay_seconds: float | None = None,
              concurrency_key: str | None = None) -> Started:
        """Admit an execution. With `if_exists="return"` the same admission
        made before (same ID, workflow and params) answers `created=False`.
        Flow control: `priority` (lower first, default 0), a first due time
        (`start_at`, or `delay_seconds` from now) and the `concurrency_key`
        (default: the one the workflow declares)."""
        body = _admission(workflow_id, params, execution_id, if_exists, timeout_seconds,
                          deadline, context,
                          _flow(priority, start_at, delay_seconds, concurrency_key))
        return _started(self._call("POST", "/v1/executions", json=body, ok=(200, 201)))

    def get(self, execution_id: str, *, wait_seconds: float | None = None) -> dict[str, Any]:
        """The execution's record; with `wait_seconds` (up to 60), as soon as
        it ends or when that time is up."""
        params = {"waitSeconds": wait_seconds} if wait_seconds else None
        timeout = self.timeout + (wait_seconds or 0)
        return _body(self._call("GET", _path(execution_id), params=params, timeout=timeout))

    def result(self, execution_id: str, timeout: float | None = None) -> Any:
        """Wait (long-poll) until the execution ends and return its result;
        raise ExecutionFailed / ExecutionCancelled / ExecutionTimedOut when it
        ended otherwise, WaitTimeout when `timeout` seconds pass first."""
        started = time.monotonic()
        record = self.get(execution_id)
        while record["status"] not in TERMINAL_STATUSES:
            wait = _wait_for(timeout, started)
            if wait is None:
                raise WaitTimeout(record, timeout or 0)
            record = self.get(execution_id, wait_seconds=wait)
        return outcome_of(record)

    def signal(self, execution_id: str, name: str, payload: Any = None) -> dict[str, Any]:
        return _body(self._call("POST", _path(execution_id, "signals", name), json=payload,
                          ok=(202,)))

    def cancel(self, execution_id: str, *, by: str | None = None) -> dict[str, Any]:
        return _body(self._call("POST", _path(execution_id, "cancel"), json=_without_none(by=by),
                          ok=(202,)))

    def terminate(self, execution_id: str, *, by: str | None = None) -> dict[str, Any]:
        return _body(self._call("POST", _path(execution_id, "terminate"), json=_without_none(by=by),
                          ok=(202,)))

    def redrive(self, execution_id: str, from_step: str | None = None, reason: str | None = None,
                timeout_seconds: float | None = None) -> dict[str, Any]:
        """Run an ended execution again from `from_step` (default: where it
        failed); answers {"executionId", "status"}."""
        body = _without_none(fromStep=from_step, reason=reason, timeoutSeconds=timeout_seconds)
        return _body(self._call("POST", _path(execution_id, "redrive"), json=body, ok=(202,)))

    def fork(self, source_id: str, from_step: str, execution_id: str | None = None,
             params: Any = None) -> dict[str, Any]:
        """A new execution (`execution_id`, else one the server picks) that
        starts from `source_id`'s recorded steps before `from_step`."""
        body = _without_none(fromStep=from_step, executionId=execution_id, params=params)
        return _body(self._call("POST", _path(source_id, "fork"), json=body, ok=(201,)))

    def move_version(self, execution_id: str, to: str | None, *, force: bool = False,
                     reason: str | None = None) -> dict[str, Any]:
        """Move the execution to code version `to` (None: unversioned) once
        its history replays against that code (the API must carry it;
        `force=True` skips the check). Answers {executionId, from, to, check,
        status, resumed, replayed}; raises ReplayDiverges (details carry the
        divergence), ReplayCheckUnavailable, ExecutionRunning /
        ExecutionChanged (retry), ExecutionEnded, ExecutionNotFound."""
        return _body(self._call("POST", _path(execution_id, "version"),
                                json=_version_move(to, force, reason)))

    def move_versions(self, to: str | None, workflow_id: str, *,
                      from_version: str | None = ANY_VERSION,
                      statuses: Sequence[str] | None = None, ids: Sequence[str] | None = None,
                      limit: int | None = None, force: bool = False, dry_run: bool = False,
                      reason: str | None = None) -> dict[str, Any]:
        """Move up to `limit` (default 100) unended executions of
        `workflow_id` (of `from_version`, None: unversioned; in `statuses`;
        among `ids`), each checked and moved as move_version does. Answers
        {moved: [ids], refused: [{executionId, code, message, divergence?}],
        matched, more, dryRun}."""
        body = _versions_move(to, workflow_id, from_version, statuses, ids, limit, force,
                              dry_run, reason)
        return _body(self._call("POST", "/v1/version-moves", json=body))

    def list(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every execution matching the filters (status, workflow_id,
        parent_execution_id, admitted_after, admitted_before, ...), newest
        first, page after page (`limit` is the page size)."""
        query = _query(filters)
        while True:
            page = _body(self._call("GET", "/v1/executions", params=query))
            yield from page["executions"]
            if not page.get("nextCursor"):
                return
            query["cursor"] = page["nextCursor"]

    def list_queues(self) -> History:
        """Every queue, by name, with its settings and counts."""
        return list(_body(self._call("GET", "/v1/queues"))["queues"])

    def get_queue(self, name: str) -> dict[str, Any]:
        """One queue: declared, run-time and effective settings, counts and
        its newest changes."""
        return _body(self._call("GET", _queue_path(name)))

    def set_queue(self, name: str, *, concurrency: int | None = KEEP,
                  per_key_concurrency: int | None = KEEP,
                  rate_limit: tuple[int, float] | None = KEEP, rate_per_key: bool = KEEP,
                  hold_while_suspended: bool = KEEP, paused: bool = KEEP,
                  reset: Sequence[str] = ()) -> dict[str, Any]:
        """Set run-time settings (they win over the declared ones; None: no
        limit) and `reset` others (wire names: concurrency, perKeyConcurrency,
        rateLimit, holdWhileSuspended, paused) to the declared ones. Creates
        a queue nobody declared. Answers the queue."""
        body = _queue_change(concurrency, per_key_concurrency, rate_limit, rate_per_key,
                             hold_while_suspended, paused, reset)
        return _body(self._call("PUT", _queue_path(name), json=body))

    def pause_queue(self, name: str) -> dict[str, Any]:
        return _body(self._call("POST", _queue_path(name, "pause")))

    def resume_queue(self, name: str) -> dict[str, Any]:
        return _body(self._call("POST", _queue_path(name, "resume")))

    def history(self, execution_id: str) -> dict[str, Any]:
        """What the replay check reads: the recorded steps in code order
        (`GET /v1/executions/{id}/history`, format fencepost-history/1)."""
        return _body(self._call("GET", _path(execution_id, "history")))

    def events(self, execution_id: str) -> History:
        """The execution's whole history, oldest first."""
        out: History = []
        after = 0
        while True:
            page = _body(self._call("GET", _path(execution_id, "events"),
                              params={"after": after, "limit": 1000}))
            out.extend(page["events"])
            if page.get("nextAfter") is None:
                return out
            after = page["nextAfter"]


# ----------------------------------------------------------------- async


class AsyncClient:
    """`Client` with coroutines, on `httpx.AsyncClient`."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, *,
                 retries_503: int = 3, **httpx_options: Any) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.retries_503 = retries_503
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout,
                                       **httpx_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, ok: tuple[int, ...] = (200,),
                    **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries_503 + 1):
            response = await self._http.request(method, path, **kwargs)
            if response.status_code != 503 or attempt == self.retries_503:
                break
            await asyncio.sleep(_retry_after(response))
        if response.status_code not in ok:
            raise error_from(response)
        return response

    async def start(self, workflow_id: str, params: Any = None, *,
                    execution_id: str | None = None,
                    if_exists: Literal["error", "return"] = "error",
                    timeout_seconds: float | None = None,
                    deadline: datetime | str | None = None,
                    context: Mapping[str, Any] | None = None, priority: int | None = None,
                    start_at: datetime | str | None = None,
                    delay_seconds: float | None = None,
                    concurrency_key: str | None = None) -> Started:
        body = _admission(workflow_id, params, execution_id, if_exists, timeout_seconds,
                          deadline, context,
                          _flow(priority, start_at, delay_seconds, concurrency_key))
        return _started(await self._call("POST", "/v1/executions", json=body, ok=(200, 201)))

    async def get(self, execution_id: str, *,
                  wait_seconds: float | None = None) -> dict[str, Any]:
        params = {"waitSeconds": wait_seconds} if wait_seconds else None
        timeout = self.timeout + (wait_seconds or 0)
        return _body(await self._call("GET", _path(execution_id), params=params,
                                 timeout=timeout))

    async def result(self, execution_id: str, timeout: float | None = None) -> Any:
        started = time.monotonic()
        record = await self.get(execution_id)
        while record["status"] not in TERMINAL_STATUSES:
            wait = _wait_for(timeout, started)
            if wait is None:
                raise WaitTimeout(record, timeout or 0)
            record = await self.get(execution_id, wait_seconds=wait)
        return outcome_of(record)

    async def signal(self, execution_id: str, name: str, payload: Any = None) -> dict[str, Any]:
        return _body(await self._call("POST", _path(execution_id, "signals", name), json=payload,
                                 ok=(202,)))

    async def cancel(self, execution_id: str, *, by: str | None = None) -> dict[str, Any]:
        return _body(await self._call("POST", _path(execution_id, "cancel"),
                                 json=_without_none(by=by), ok=(202,)))

    async def terminate(self, execution_id: str, *, by: str | None = None) -> dict[str, Any]:
        return _body(await self._call("POST", _path(execution_id, "terminate"),
                                 json=_without_none(by=by), ok=(202,)))

    async def redrive(self, execution_id: str, from_step: str | None = None,
                      reason: str | None = None,
                      timeout_seconds: float | None = None) -> dict[str, Any]:
        body = _without_none(fromStep=from_step, reason=reason, timeoutSeconds=timeout_seconds)
        return _body(await self._call("POST", _path(execution_id, "redrive"), json=body,
                                 ok=(202,)))

    async def fork(self, source_id: str, from_step: str, execution_id: str | None = None,
                   params: Any = None) -> dict[str, Any]:
        body = _without_none(fromStep=from_step, executionId=execution_id, params=params)
        return _body(await self._call("POST", _path(source_id, "fork"), json=body,
                                 ok=(201,)))

    async def move_version(self, execution_id: str, to: str | None, *, force: bool = False,
                           reason: str | None = None) -> dict[str, Any]:
        return _body(await self._call("POST", _path(execution_id, "version"),
                                      json=_version_move(to, force, reason)))

    async def move_versions(self, to: str | None, workflow_id: str, *,
                            from_version: str | None = ANY_VERSION,
                            statuses: Sequence[str] | None = None,
                            ids: Sequence[str] | None = None, limit: int | None = None,
                            force: bool = False, dry_run: bool = False,
                            reason: str | None = None) -> dict[str, Any]:
        body = _versions_move(to, workflow_id, from_version, statuses, ids, limit, force,
                              dry_run, reason)
        return _body(await self._call("POST", "/v1/version-moves", json=body))

    async def list(self, **filters: Any) -> AsyncIterator[dict[str, Any]]:
        query = _query(filters)
        while True:
            page = _body(await self._call("GET", "/v1/executions", params=query))
            for execution in page["executions"]:
                yield execution
            if not page.get("nextCursor"):
                return
            query["cursor"] = page["nextCursor"]

    async def list_queues(self) -> History:
        return list((_body(await self._call("GET", "/v1/queues")))["queues"])

    async def get_queue(self, name: str) -> dict[str, Any]:
        return _body(await self._call("GET", _queue_path(name)))

    async def set_queue(self, name: str, *, concurrency: int | None = KEEP,
                        per_key_concurrency: int | None = KEEP,
                        rate_limit: tuple[int, float] | None = KEEP,
                        rate_per_key: bool = KEEP, hold_while_suspended: bool = KEEP,
                        paused: bool = KEEP, reset: Sequence[str] = ()) -> dict[str, Any]:
        body = _queue_change(concurrency, per_key_concurrency, rate_limit, rate_per_key,
                             hold_while_suspended, paused, reset)
        return _body(await self._call("PUT", _queue_path(name), json=body))

    async def pause_queue(self, name: str) -> dict[str, Any]:
        return _body(await self._call("POST", _queue_path(name, "pause")))

    async def resume_queue(self, name: str) -> dict[str, Any]:
        return _body(await self._call("POST", _queue_path(name, "resume")))

    async def history(self, execution_id: str) -> dict[str, Any]:
        return _body(await self._call("GET", _path(execution_id, "history")))

    async def events(self, execution_id: str) -> History:
        out: History = []
        after = 0
        while True:
            page = _body(await self._call("GET", _path(execution_id, "events"),
                                     params={"after": after, "limit": 1000}))
            out.extend(page["events"])
            if page.get("nextAfter") is None:
                return out
            after = page["nextAfter"]
