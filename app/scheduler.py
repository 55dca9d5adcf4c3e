"""The scheduler: a worker maintenance service that fires schedule slots.

Every worker runs one, for the workflows it runs; it evaluates only while the
worker leads the schedules role of that set of workflows (app/maintenance.py),
so N workers do not evaluate the same schedules N times. `run_once()` takes each
unpaused schedule of those workflows in turn, locks it (another worker
evaluating it right now means this one moves on), computes the slots in
(last_slot, now] with the database clock, admits the newest `catch_up` of
them as `{schedule_id}~{slot in UTC}` with the schedule's params, records
any older ones as skipped, and moves last_slot to now, all before the lock
is released.

Why each slot fires once: admission is insert-if-absent on the execution ID,
and the ID is a function of (schedule, slot). A worker that admitted a slot
and died before moving last_slot leaves the slot to be evaluated again; the
second admission is a Conflict (the 409) and nothing new runs. `last_slot`
never moves backwards, and only after the admissions it covers.

`run()` first upserts the schedules declared in code (`@workflow(...,
schedule=..., timezone=...)`, schedule ID = workflow ID) and deletes the
code-defined schedules of this worker's workflows that no longer declare one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app import cron
from app.dberrors import INFRASTRUCTURE_ERRORS
from app.maintenance import Leadership, every
from app.metrics import METRICS
from app.registry import WorkflowDefinition
from app.store import Admitted, Conflict, ExecutionStore
from app.store.records import ScheduleRecord

log = logging.getLogger("fencepost.scheduler")

# Scheduled executions are admitted with this params value when the schedule
# declares none (code-defined schedules).
CODE_SCHEDULE_PARAMS: dict = {}


@dataclass
class SchedulerPass:
    """What one run_once did."""

    admitted: list[str] = field(default_factory=list)  # execution IDs this pass admitted
    conflicts: list[str] = field(default_factory=list)  # slots some admission already took
    skipped: int = 0  # missed slots left unadmitted (catch-up bound)
    evaluated: int = 0  # schedules this pass held the lock of


class Scheduler:
    def __init__(
        self,
        store: ExecutionStore,
        workflows: dict[str, WorkflowDefinition],
        catch_up_default: int = 1,
        interval: float = 10.0,
        *,
        retention_seconds: float | None = None,
        prune_every_seconds: float = 3600.0,
    ):
        if catch_up_default < 1:
            raise ValueError("catch_up_default must be at least 1")
        if interval <= 0:
            raise ValueError("scheduler interval must be positive")
        self.store = store
        self.workflows = workflows
        self.catch_up_default = catch_up_default
        self.interval = interval
        self.retention_seconds = retention_seconds
        self.prune_every_seconds = prune_every_seconds
        self._next_prune = 0.0
        self._reported: set[tuple[str, str, str]] = set()
        # schedule ID -> ((cron, timezone, last_slot), first slot after last_slot)
        self._next: dict[str, tuple[tuple, datetime | None]] = {}

    @classmethod
    def from_settings(cls, store: ExecutionStore, workflows: dict[str, WorkflowDefinition],
                      settings) -> Scheduler:
        return cls(store, workflows, settings.schedule_catch_up,
                   settings.scheduler_interval_seconds,
                   retention_seconds=settings.retention.total_seconds())

    # ------------------------------------------------------------ code schedules

    async def sync_code_schedules(self) -> list[ScheduleRecord]:
        """Upsert every schedule declared by this worker's workflow code; drop
        code-defined schedules of its workflows whose code declares none."""
        rows = []
        for definition in sorted(self.workflows.values(), key=lambda d: d.workflow_id):
            if not definition.schedule:
                continue
            row = await self.store.schedules.upsert_code_schedule(
                schedule_id=definition.workflow_id,
                workflow_id=definition.workflow_id,
                cron=definition.schedule,
                timezone=definition.timezone or "UTC",
                params=CODE_SCHEDULE_PARAMS,
            )
            if row is None:
                # Only a concurrent DELETE between the upsert and its re-read leaves no row.
                raise RuntimeError(f"schedule {definition.workflow_id} was deleted while declared")
            rows.append(row)
            log.info("schedule %s: %r in %s%s", row["schedule_id"], row["cron"], row["timezone"],
                     " (paused)" if row["paused"] else "")
        unscheduled = sorted(w for w, d in self.workflows.items() if not d.schedule)
        if unscheduled:
            for schedule_id in await self.store.schedules.drop_code_schedules(unscheduled):
                log.info("schedule %s deleted: its workflow code no longer declares one",
                         schedule_id)
        return rows

    # ---------------------------------------------------------------- evaluation

    async def run_once(self, until: datetime | None = None) -> SchedulerPass:
        """Evaluate every unpaused schedule of this worker's workflows up to
        the database's now (or `until`, if earlier: tests replay past days)."""
        result = SchedulerPass()
        candidates = await self.store.schedules.due_schedules(sorted(self.workflows))
        known = {c["schedule_id"] for c in candidates}
        self._next = {k: v for k, v in self._next.items() if k in known}
        for candidate in candidates:
            now = candidate["db_now"] if until is None else min(until, candidate["db_now"])
            if not self._may_be_due(candidate, now):
                continue  # no slot since last_slot: no lock, no transaction
            try:
                await self._evaluate(candidate["schedule_id"], result, until)
            except INFRASTRUCTURE_ERRORS:
                raise
            except Exception:
                # One broken schedule must not stop the others, nor the worker.
                log.exception("schedule %s: evaluation failed; retrying next pass",
                              candidate["schedule_id"])
        return result

    def _may_be_due(self, s: ScheduleRecord, now: datetime) -> bool:
        """False only when the schedule's first slot after last_slot is known
        to be later than `now` (cached per definition and last_slot)."""
        key = (s["cron"], s["timezone"], s["last_slot"])
        cached = self._next.get(s["schedule_id"])
        if cached is None or cached[0] != key:
            try:
                first = cron.next_slot(cron.parse(s["cron"]), cron.zone(s["timezone"]),
                                       s["last_slot"])
            except (cron.CronError, cron.TimezoneError):
                return True  # _evaluate reports it
            cached = (key, first)
            self._next[s["schedule_id"]] = cached
        first = cached[1]
        # None: nothing within next_slot's horizon; evaluating moves last_slot on.
        return first is None or first <= now

    async def _evaluate(self, schedule_id: str, result: SchedulerPass,
                        until: datetime | None) -> None:
        async with self.store.schedules.schedule_turn(schedule_id) as turn:
            if turn is None:  # paused, deleted, or another worker holds it right now
                return
            s = turn.schedule
            now = turn.now if until is None else min(until, turn.now)
            definition = self.workflows.get(s["workflow_id"])
            if definition is None:  # re-pointed at a workflow this worker does not run
                return
            try:
                expression = cron.parse(s["cron"])
                tz = cron.zone(s["timezone"])
                concurrency_key = definition.key_of(s["params"])
            except (cron.CronError, cron.TimezoneError, ValueError) as exc:
                key = (schedule_id, s["cron"], s["timezone"])
                if key not in self._reported:
                    self._reported.add(key)
                    log.error("schedule %s cannot be evaluated here: %s", schedule_id, exc)
                return
            result.evaluated += 1
            catch_up = s["catch_up"] or self.catch_up_default
            to_admit, skipped = cron.slots(expression, tz, s["last_slot"], now, catch_up)
            for slot in to_admit:
                execution_id = cron.slot_id(schedule_id, slot)
                answer = await self.store.admissions.admit(
                    workflow_id=s["workflow_id"],
                    params=s["params"],
                    context={"scheduleId": schedule_id, "scheduledAt": _iso(slot)},
                    execution_id=execution_id,
                    timeout_seconds=definition.timeout_seconds,
                    queue=definition.queue.name,
                    concurrency_key=concurrency_key,
                    code_version=definition.version,
                )
                if isinstance(answer, Admitted):
                    result.admitted.append(execution_id)
                    await self.store.schedules.record_schedule_fired(schedule_id, execution_id, slot)
                    METRICS.schedule_slots.labels("fired").inc()
                    log.info("schedule %s fired slot %s as %s", schedule_id, _iso(slot),
                             execution_id)
                else:
                    # Already admitted (by another worker, or before a crash).
                    result.conflicts.append(execution_id)
                    if isinstance(answer, Conflict) and answer.workflow_id != s["workflow_id"]:
                        log.warning("schedule %s: slot ID %s is taken by an execution of %s",
                                    schedule_id, execution_id, answer.workflow_id)
            detail = None
            if skipped:
                result.skipped += skipped
                METRICS.schedule_slots.labels("skipped").inc(skipped)
                detail = {
                    "catchUp": catch_up,
                    "after": _iso(s["last_slot"]),
                    "until": _iso(now),
                    "windowLimited": now - s["last_slot"] > cron.MAX_WINDOW,
                    "firstAdmitted": _iso(to_admit[0]) if to_admit else None,
                }
                log.warning("schedule %s: %d missed slots skipped (catch-up %d)", schedule_id,
                            skipped, catch_up)
            await turn.finish(now, skipped=skipped, detail=detail)

    # ----------------------------------------------------------------- service

    async def prune_events(self) -> int:
        if not self.retention_seconds:
            return 0
        return await self.store.schedules.prune_schedule_events(sorted(self.workflows),
                                                      self.retention_seconds)

    async def sweep(self) -> None:
        await self.run_once()
        METRICS.maintained("scheduler")
        if self.retention_seconds and time.monotonic() >= self._next_prune:
            await self.prune_events()
            self._next_prune = time.monotonic() + self.prune_every_seconds

    async def run(self, stop: asyncio.Event, leadership: Leadership | None = None) -> None:
        """Declare this worker's code schedules (every worker: its own code),
        then evaluate every interval until `stop` (only while leading, with
        `leadership`)."""
        await self.sync_code_schedules()
        await every(self.interval, stop, self.sweep, leadership)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
