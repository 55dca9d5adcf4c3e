"""The replay check: run the current workflow code against an execution's
recorded history (the document `GET /v1/executions/{id}/history` exports)
and say whether the code asks for the same steps in the same order.

Nothing runs but the workflow function itself: no step function, effect,
transaction, child start or signal consumption. Each ctx call the history
answers is replayed through the SDK's own checks (the ones a worker applies
at run time, so the check and run time cannot disagree); the first call it
does not answer is the frontier, where a worker would run something new, and
the replay ends there.

    report = await replay(definition, history)
    report.ok, report.end, report.divergence
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from pydantic import ValidationError

from app.registry import WorkflowDefinition
from app.sdk import WorkflowContext, divergence
from app.store import Delivery, ExecutionStore, Lease, StepRecord
from app.store.exports import HISTORY_FORMAT

FRONTIER, RETURNED, RAISED = "frontier", "returned", "raised"


class HistoryFormatError(ValueError):
    """A document that is not a fencepost history this code reads."""


@dataclass(frozen=True)
class ReplayReport:
    execution_id: str
    workflow_id: str
    ok: bool
    replayed: int                 # recorded steps the code reached (asked for and got)
    end: str                      # "frontier" (code would run something new: history ends
                                  # here), "returned" (code returned), "raised" (code raised:
                                  # a recorded failure it did not catch, Cancelled, ...)
    divergence: dict[str, Any] | None  # app.sdk.divergence()'s shape; None when ok

    def to_json(self) -> dict[str, Any]:
        return {"executionId": self.execution_id, "workflowId": self.workflow_id,
                "ok": self.ok, "replayed": self.replayed, "end": self.end,
                "divergence": self.divergence}


class _Frontier(BaseException):
    """The code reached a call the history does not answer. A BaseException,
    latched: workflow code cannot swallow it and run on past the history."""


class _NoStore:
    """The replay's store: any use of it means the code got past the
    history, so it ends the replay there (nothing reaches a database)."""

    def __getattr__(self, name: str) -> Any:
        raise _Frontier(f"the store's {name} was reached")


class ReplayContext(WorkflowContext):
    """A WorkflowContext over an exported history, with no store: what the
    history answers replays exactly as in a delivery; anything new ends the
    replay at the frontier before it runs."""

    def __init__(self, delivery: Delivery, steps: dict[str, StepRecord],
                 definition: WorkflowDefinition, params: Any,
                 workflows: dict[str, WorkflowDefinition] | None = None):
        super().__init__(cast(ExecutionStore, _NoStore()), delivery, steps, definition, params,
                         workflows)
        self.frontier = False
        self.replayed = 0

    def _live(self) -> None:
        super()._live()
        if self.frontier:
            raise _Frontier("the replay reached the end of the history")

    def _gate(self, *, wait: bool = False) -> None:
        # Every ctx call reaches _gate only after the history did not answer
        # it: this is where a delivery would run, record or wait for
        # something new - or, with a cancel or deadline known and history
        # left (its cleanup's steps), where the delivery raised it.
        self._live()
        if self.interrupt and (wait or not self._interrupt_raised) \
                and self.history_left():
            super()._gate(wait=wait)
        self.frontier = True
        raise _Frontier("the code asks for something the history does not hold")

    def _take(self, key: str, function_name: str, *, generated: bool = False) -> StepRecord | None:
        recorded = super()._take(key, function_name, generated=generated)
        if recorded is not None:
            self.replayed += 1
        return recorded

    def _settled(self, record: StepRecord) -> Any:
        # Reached with a record the history holds (a child wait's): replayed,
        # with no interrupt to raise (the replay knows of none).
        return self._replay(record)

    async def _timer_due_at(self, key: str, *, delay: float | None = None,
                            until: datetime | None = None,
                            generated: bool = False,
                            taken: StepRecord | None = None) -> datetime | None:
        # A recorded timer is due: the code goes on past it, and if the
        # history ends there, the next ask is the frontier. (Had a cancel
        # been raised at it, the next ask meets the cleanup's first recorded
        # step at its position, and the cancel is raised there: see _take.)
        if taken is None and self._take(key, "sleep", generated=generated) is None:
            self._gate(wait=True)
        return None


def steps_of(document: dict[str, Any]) -> dict[str, StepRecord]:
    """The StepRecords a worker would read, from the document's steps."""
    steps: dict[str, StepRecord] = {}
    for s in document["steps"]:
        at = s.get("recordedAt")
        steps[s["key"]] = StepRecord(
            step_key=s["key"], status=s["status"], value=s.get("value"), error=s.get("error"),
            function_name=s.get("functionName"), attempts=int(s.get("attempts") or 1), token=0,
            recorded_at=datetime.fromisoformat(at) if at else datetime.now(UTC),
            position=s.get("position"))
    return steps


def check_document(document: Any) -> dict[str, Any]:
    """`document` if it is a history this code reads; HistoryFormatError if not."""
    if not isinstance(document, dict):
        raise HistoryFormatError("a history is a JSON object")
    if document.get("format") != HISTORY_FORMAT:
        raise HistoryFormatError(f"format {document.get('format')!r} is not {HISTORY_FORMAT!r}")
    for field in ("executionId", "workflowId", "steps"):
        if field not in document:
            raise HistoryFormatError(f"the history has no {field!r}")
    if not isinstance(document["steps"], list) or not all(
            isinstance(s, dict) and isinstance(s.get("key"), str) and "status" in s
            for s in document["steps"]):
        raise HistoryFormatError("steps: a list of objects, each with a key and a status")
    return document


def _delivery(document: dict[str, Any]) -> Delivery:
    now = datetime.now(UTC)
    return Delivery(
        lease=Lease(document["executionId"], 1, now, "replay"),
        workflow_id=document["workflowId"], params=document.get("params"),
        context=document.get("context") or {}, status_before=document.get("status") or "",
        outcome=None, unacknowledged_deliveries=0, deadline=None,
        code_version=document.get("codeVersion"), claimed_at=now,
        # A cancel or deadline the execution met: raised where the history
        # shows its cleanup began, as the delivery raised it.
        interrupt=document.get("interrupt") if document.get("interrupt") in (
            "cancel", "deadline") else None)


async def replay(definition: WorkflowDefinition, history: dict[str, Any],
                 workflows: dict[str, WorkflowDefinition] | None = None) -> ReplayReport:
    """Run `definition`'s code against `history` (an exported document) and
    report whether it fits. Raises HistoryFormatError for a document this
    code does not read, ValueError for another workflow's history."""
    document = check_document(history)
    if document["workflowId"] != definition.workflow_id:
        raise ValueError(f"execution {document['executionId']!r} is of workflow "
                         f"{document['workflowId']!r}, not {definition.workflow_id!r}")
    execution_id = document["executionId"]

    def report(ok: bool, replayed: int, end: str, found: dict[str, Any] | None) -> ReplayReport:
        return ReplayReport(execution_id, definition.workflow_id, ok, replayed, end, found)

    try:
        params = definition.parse_params(document.get("params"))
    except ValidationError as exc:
        return report(False, 0, RAISED, divergence(
            None, None, None, f"params no longer match the workflow's params model: {exc}"))

    async def run() -> ReplayReport:
        # Built in the task that runs the code: asks from this task are
        # numbered and compared by position, as in a delivery.
        ctx = ReplayContext(_delivery(document), steps_of(document), definition, params,
                            workflows)
        raised: BaseException | None = None
        try:
            await definition.fn(ctx, params)
            end = RETURNED
        except _Frontier:
            end = FRONTIER
        except BaseException as exc:  # noqa: BLE001 - the code's own end, reported
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            end, raised = RAISED, exc
        if ctx.frontier:
            end = FRONTIER  # reached, then swallowed: the latch ended the code anyway
        if ctx.diverged is not None:
            # Latched: the first divergence stands, even if the code swallowed it.
            return report(False, ctx.replayed, end, ctx.diverged)
        if end == FRONTIER:
            return report(True, ctx.replayed, end, None)
        found = ctx.divergence_at_end(raised)
        return report(found is None, ctx.replayed, end, found)

    return await asyncio.create_task(run(), name=f"replay {execution_id}")
