"""The worker: a dispatcher that claims due executions, replays their workflow
code under a lease, renews every held lease in one statement, and
acknowledges how each delivery ended.

Side tasks (claimer, renewer, listener, the maintenance leases and services)
are named and watched: if one dies, the worker stops loudly rather than run
half-alive. One worker at a time runs each maintenance service (the leader of
its role, app/maintenance.py); the others only take part in the election.
SIGTERM stops claiming, lets running deliveries finish within the grace
period, releases what is left (and the maintenance roles it leads) and exits
0; a second SIGTERM/SIGINT exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg
from pydantic import ValidationError

from app import tracing
from app.bulk import OperationRunner
from app.db import asyncpg_dsn, create_pool
from app.dberrors import INFRASTRUCTURE_ERRORS, is_infrastructure
from app.logs import Fields
from app.maintenance import SWEEPS, Leadership, schedules_role
from app.metrics import METRICS
from app.migrate import SchemaOutOfDate, check_schema
from app.reaper import LeaseReaper
from app.registry import WorkflowDefinition, declared_queues
from app.retention import RetentionPruner
from app.scheduler import Scheduler
from app.sdk import (
    Cancelled,
    DeadlineExceeded,
    DeliveryStopped,
    Nondeterminism,
    Park,
    Retry,
    Suspend,
    WorkflowContext,
    error_of,
    format_traceback,
    keep_late_observation,
    value_problem,
)
from app.settings import ConfigurationError, Settings
from app.store import (
    NOTIFY_CHANNEL,
    Delivery,
    ExecutionStore,
    Interrupt,
    InvalidEvent,
    Lease,
    LeaseLost,
    StepRecord,
)

log = logging.getLogger("fencepost.worker")

# How a delivery's final write ends it: acknowledged with a status, released
# for a retry, or parked with its effect's outcome unknown.
Acknowledgement = Literal["suspended", "completed", "failed", "cancelled", "timed_out"]
Ending = Acknowledgement | Literal["retry", "park"]

# A release at shutdown that finds its lease taken over, or the database
# gone, leaves the execution to the lease's expiry.
_RELEASE_GIVEN_UP: tuple[type[BaseException], ...] = (LeaseLost, *INFRASTRUCTURE_ERRORS)
# Errors after which the listener reconnects.
_LISTEN_LOST: tuple[type[BaseException], ...] = (
    *INFRASTRUCTURE_ERRORS, asyncpg.PostgresError, TimeoutError)

# How long a busy worker gathers freed slots before claiming; an idle worker
# claims at once (start latency), a busy one in batches (fewer statements).
CLAIM_BATCH_SECONDS = 0.003

# How many passes of the event loop a pending signal's handler may need to
# run: a signal reaches the loop as a byte on its wakeup socket, read at the
# loop's next I/O poll, and the handler is queued behind every callback
# already ready. uvloop runs it within 2 yields of the task that saw the
# signal land, asyncio's own loop within 3 (tests/worker_processes/
# test_stop_before_claim.py checks both).
SIGNAL_PASSES = 3


async def let_pending_signals_run() -> None:
    """Return once the handler of any signal this process received before
    the call has run (see SIGNAL_PASSES)."""
    for _ in range(SIGNAL_PASSES):
        await asyncio.sleep(0)


@dataclass
class Running:
    lease: Lease
    task: asyncio.Task
    workflow_id: str = ""
    lost: bool = False
    ctx: WorkflowContext | None = None
    # "cancel" / "deadline": the worker stopped the delivery because its code
    # did not finish before its cleanup window closed.
    forced: str | None = None
    enforcing: asyncio.TimerHandle | None = None
    # The final write, once started: the drain waits for it, never releases under it.
    finishing: asyncio.Future | None = None
    # When the claim began by the database clock, and the event loop's time
    # when the delivery started: how this worker places a database time it
    # is told (the wake time of a suspension) on its own clock.
    claimed_at: datetime | None = None
    started_at: float = 0.0


def _model_name(definition: WorkflowDefinition) -> str:
    """The name of the workflow's params model (only a model refuses params)."""
    model = definition.params_model
    return model.__name__ if model is not None else "its params"


def _ids(lease: Lease) -> dict:
    """Structured log fields of a delivery: identifiers only, never values."""
    return {"execution_id": lease.execution_id, "token": lease.token}


def _jsonable(value: dict | None) -> dict | None:
    """`suspended_on` as JSON (wake times become ISO strings)."""
    if value is None:
        return None
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in value.items()}


class Backoff:
    """Exponential backoff with full jitter, for database outages."""

    def __init__(self, first: float = 0.2, cap: float = 5.0):
        self.first, self.cap, self.failures = first, cap, 0

    def next(self) -> float:
        self.failures += 1
        return random.uniform(0, min(self.cap, self.first * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


class Worker:
    def __init__(
        self,
        settings: Settings,
        workflows: dict[str, WorkflowDefinition],
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not workflows:
            raise ValueError("a worker needs at least one workflow; set FENCEPOST_WORKFLOWS")
        self.settings = settings
        self.workflows = workflows
        self.concurrency = concurrency
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.store: ExecutionStore | None = None
        # Renewals and heartbeats go through their own small pool, so
        # deliveries holding every connection of the main pool cannot starve them.
        self.control: ExecutionStore | None = None
        self._running: dict[str, Running] = {}
        self.leaderships: list[Leadership] = []  # the maintenance roles it takes part in
        self._wakeup = asyncio.Event()
        self._stopping = asyncio.Event()  # stop claiming
        self._done = asyncio.Event()  # renewer and listener may stop
        self._maybe_more_due = False
        # The event loop's time the idle claimer sleeps until (None: awake),
        # and the earliest wake of a suspension of this worker's own that
        # committed while it was awake (its claim may not have seen it).
        self._claim_at: float | None = None
        self._suspended_due: float | None = None
        self._signals = 0
        self.log = Fields(log, {"worker_id": self.worker_id})
        METRICS.init_workflows(workflows)
        METRICS.init_queues(sorted({d.queue.name for d in workflows.values()}))
        METRICS.capacity.set(concurrency)

    @property
    def _db(self) -> ExecutionStore:
        """The store on the main pool: set by `run()` before any task that uses it."""
        if self.store is None:
            raise RuntimeError("the worker is not running")
        return self.store

    @property
    def _control_db(self) -> ExecutionStore:
        """The store on the control pool (renewals, heartbeats), set with `_db`."""
        if self.control is None:
            raise RuntimeError("the worker is not running")
        return self.control

    # ----------------------------------------------------------------- control

    def request_stop(self) -> None:
        self._stopping.set()
        self._wakeup.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            self._signals += 1
            if self._signals > 1:
                self.log.warning("second signal: exiting at once")
                os._exit(1)
            self.log.info("signal %s: stop claiming, finish running deliveries", signum)
            self.request_stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)

    async def run(self) -> None:
        s = self.settings
        # Sync step functions run on the default executor: size it so that
        # `concurrency` of them can run at once.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=self.concurrency + 4, thread_name_prefix="step")
        )
        pool = await create_pool(
            s, min_size=1, max_size=max(s.pool_max_size, min(self.concurrency, 40) + 3),
            application_name=f"fencepost-worker {self.worker_id}"[:63],
        )
        control_pool = None
        try:
            control_pool = await create_pool(
                s, min_size=1, max_size=2,
                application_name=f"fencepost-renewer {self.worker_id}"[:63],
            )
            self.control = ExecutionStore.from_settings(control_pool, s)
            try:
                await check_schema(pool)
            except SchemaOutOfDate as exc:
                raise SystemExit(f"error: {exc}") from None
            self.store = ExecutionStore.from_settings(pool, s)
            await self._register()
            self.log.info("worker %s started: %s, concurrency %d", self.worker_id,
                     ", ".join(sorted(self.workflows)), self.concurrency)
            # One worker at a time runs each maintenance role; every worker
            # takes part in the election (app/maintenance.py). Its statements
            # use the main pool: the control pool stays the renewer's alone,
            # so a delivery's lease renewal never queues behind them.
            leaders = self.store.maintenance  # self.store is on the main pool
            sweeps = Leadership(leaders, SWEEPS, self.worker_id, s.maintenance_lease_seconds)
            schedules = Leadership(leaders, schedules_role(sorted(self.workflows)),
                                   self.worker_id, s.maintenance_lease_seconds)
            self.leaderships = [sweeps, schedules]
            for lead in self.leaderships:
                try:
                    await lead.attempt()  # a free role is run from the first pass
                except INFRASTRUCTURE_ERRORS:
                    pass  # its holder task retries
            side = [
                asyncio.create_task(self._claimer(), name="claimer"),
                asyncio.create_task(self._renewer(), name="renewer"),
                asyncio.create_task(self._listener(), name="listener"),
                *(asyncio.create_task(self._maintain(lead), name=f"lease {lead.role}")
                  for lead in self.leaderships),
                asyncio.create_task(self._maintain(LeaseReaper(
                    self.store, interval=max(0.1, min(s.lease_seconds / 2, 5.0))), sweeps),
                    name="reaper"),
                asyncio.create_task(self._maintain(RetentionPruner(
                    self.store, retention_seconds=s.retention.total_seconds()), sweeps),
                    name="retention"),
                asyncio.create_task(self._maintain(
                    Scheduler.from_settings(self.store, self.workflows, s), schedules),
                    name="scheduler"),
                asyncio.create_task(self._maintain(OperationRunner(
                    self.store, interval=s.poll_seconds), sweeps), name="operations"),
            ]
            await self._watch(side)
            await self._drain()
            self._done.set()
            for task in side:
                task.cancel()  # listener and maintenance stop here
            await asyncio.gather(*side, return_exceptions=True)
            for lead in self.leaderships:
                try:
                    await lead.release()  # the next leader need not wait for the expiry
                except INFRASTRUCTURE_ERRORS:
                    pass
            try:
                await self.store.workers.worker_stopped(self.worker_id)
            except INFRASTRUCTURE_ERRORS:
                pass
            self.log.info("worker %s stopped", self.worker_id)
        finally:
            if control_pool is not None:
                await control_pool.close()
            if self.store is not None:
                # A write still waiting for a row another transaction holds
                # keeps a connection: cancelled (rolled back) before closing,
                # or closing would wait for that holder.
                await self.store.steps.cancel_held_writes()
            await pool.close()

    async def _register(self) -> None:
        """Take this worker's ID, unless another live worker holds it (two
        processes under one ID would renew, and report, each other's work).
        A holder on this host whose process is gone is dead: its ID is free."""
        host, workflows = socket.gethostname(), sorted(self.workflows)
        versions = {w: self.workflows[w].version for w in workflows}
        holder = await self._db.workers.register_worker(
            self.worker_id, host=host, pid=os.getpid(), workflows=workflows,
            concurrency=self.concurrency, live_within_seconds=3 * self.settings.renew_seconds + 1,
            versions=versions)
        if holder is not None and holder["host"] == host and not _pid_alive(holder["pid"]):
            holder = await self._db.workers.register_worker(
                self.worker_id, host=host, pid=os.getpid(), workflows=workflows,
                concurrency=self.concurrency, versions=versions)
        if holder is not None:
            raise ConfigurationError(
                f"worker ID {self.worker_id!r} is already held by a live worker (host "
                f"{holder['host']}, pid {holder['pid']}, last heartbeat "
                f"{holder['heartbeat_at'].isoformat()}): give this worker another --worker-id, "
                "or stop that one first")
        # The queues this code declares, before any claim reads them.
        await self._db.queues.declare(
            {q.name: q.settings() for q in declared_queues(self.workflows)})

    async def _watch(self, side: list[asyncio.Task]) -> None:
        """Return when the claimer stops; a side task that dies stops the worker loudly."""
        claimer = side[0]
        while True:
            done, _ = await asyncio.wait(side, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is claimer and task.exception() is None:
                    return
                exc = task.exception() if not task.cancelled() else None
                self.request_stop()
                raise RuntimeError(f"worker side task {task.get_name()!r} died: {exc!r}") from exc

    async def _drain(self) -> None:
        """Let running deliveries finish within the grace period, then stop
        them and release their leases so another worker can take them."""
        tasks = [r.task for r in self._running.values()]
        if tasks:
            self.log.info("waiting up to %.1fs for %d deliveries", self.settings.shutdown_grace_seconds,
                     len(tasks))
            await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_seconds)
        leftover = list(self._running.values())
        for running in leftover:
            running.task.cancel()
        await asyncio.gather(*(r.task for r in leftover), return_exceptions=True)
        for running in leftover:
            if running.finishing is not None:
                # The delivery's own final write is in flight: it decides,
                # and a release must not race it.
                await asyncio.gather(running.finishing, return_exceptions=True)
                continue
            try:
                await self._db.leases.release(running.lease)
                METRICS.unacknowledged_deliveries.inc()
                self.log.info("released %s (token %d) at shutdown", running.lease.execution_id,
                              running.lease.token, extra=_ids(running.lease))
            except _RELEASE_GIVEN_UP:
                pass

    # ----------------------------------------------------------------- claimer

    async def _claimer(self) -> None:
        backoff = Backoff()
        workflow_ids = sorted(self.workflows)
        # Each workflow's cleanup window in this worker's code, written on
        # the rows it claims (the store bounds cleanup deliveries with it).
        cleanup_seconds = [grace if (grace := self.workflows[w].cancel_grace) is not None
                           else self.settings.cancel_grace_seconds for w in workflow_ids]
        # The code version each carries: versioned executions route by it.
        versions = [self.workflows[w].version for w in workflow_ids]
        loop = asyncio.get_running_loop()
        # The event loop's time when the earliest due time the last claim
        # told of comes (None: it told of none).
        next_due: float | None = None
        while not self._stopping.is_set():
            free = self.concurrency - len(self._running)
            if 0 < free < self.concurrency:
                # Busy: let a few more deliveries finish (and wakes arrive)
                # so that one claim statement takes several executions.
                await asyncio.sleep(CLAIM_BATCH_SECONDS)
                if self._stopping.is_set():
                    break  # a stop that landed while gathering: claim nothing more
                free = self.concurrency - len(self._running)
            self._wakeup.clear()
            if free > 0:
                # No claim begins after a stop signal reached this process:
                # its handler (request_stop) runs before this check, even
                # when the signal landed in the same loop pass that woke the
                # claimer (a due time, a NOTIFY, a freed slot).
                await let_pending_signals_run()
                if self._stopping.is_set():
                    break
                free = self.concurrency - len(self._running)
                try:
                    deliveries = await self._db.leases.claim_due(
                        free, self.settings.lease_seconds, self.worker_id, workflow_ids,
                        cleanup_seconds, versions,
                    )
                    backoff.reset()
                except Exception as exc:
                    if not is_infrastructure(exc):
                        raise
                    delay = backoff.next()
                    self.log.warning("claim failed (%s); retrying in %.2fs", exc, delay)
                    await self._sleep(delay)
                    continue
                next_due = (None if deliveries.next_due_in is None
                            else loop.time() + deliveries.next_due_in)
                steps = await self._prefetch_steps(deliveries)
                for delivery in deliveries:
                    self._start(delivery, steps.get(delivery.lease.execution_id))
                # A full batch may have left more due; so may a batch a limit
                # trimmed (a key's backlog fills a claim's scan, and the keys
                # behind it are reached by the next claim, at once).
                self._maybe_more_due = (len(deliveries) == free
                                        or any(d.slot_limited for d in deliveries))
                if self._maybe_more_due:
                    continue
            # Until the earliest due time the claim told of (a timer is
            # claimed when due, not at the next poll), at most the poll
            # interval: admissions, wakes and signals NOTIFY; the poll covers
            # what no NOTIFY announces (a due time another process set after
            # this claim, a redelivery delay ending). A millisecond past it,
            # so that the claim's clock sees it due. With every slot taken
            # (no claim this round), a freed slot wakes the claimer instead.
            wait = self.settings.poll_seconds
            if free > 0:
                if self._suspended_due is not None:
                    next_due = (self._suspended_due if next_due is None
                                else min(next_due, self._suspended_due))
                    self._suspended_due = None
                if next_due is not None:
                    wait = min(wait, max(0.0, next_due - loop.time()) + 0.001)
            await self._sleep(wait)

    async def _prefetch_steps(self, deliveries: list[Delivery]) -> dict[str, dict]:
        """The recorded steps of claimed replays, in one statement. The claim
        has committed: if this read fails, each delivery reads its own steps
        (no claimed execution is left to its lease's expiry)."""
        # A first claim of an execution that was not forked finds nothing
        # recorded (no holder came before it): there is nothing to read.
        replays = [d.lease.execution_id for d in deliveries if d.has_history]
        none_yet: dict[str, dict[str, StepRecord]] = {d.lease.execution_id: {}
                                                      for d in deliveries}
        if not replays:
            return none_yet
        try:
            return {**none_yet, **await self._db.history.steps(replays)}
        except Exception as exc:
            if not is_infrastructure(exc):
                raise
            self.log.warning("reading the steps of %d claimed executions failed (%s); "
                             "each delivery reads its own", len(replays), exc)
            return {eid: steps for eid, steps in none_yet.items() if eid not in replays}

    async def _sleep(self, seconds: float) -> None:
        """Sleep until woken (notify, a freed slot, a nearer due time, stop)
        or `seconds` pass."""
        self._claim_at = asyncio.get_running_loop().time() + seconds
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)
        except TimeoutError:
            pass
        finally:
            self._claim_at = None

    def _suspended_until(self, lease: Lease, until: Any) -> None:
        """A delivery of this worker suspended until `until` (a wake time, by
        the database clock): a claimer asleep past it is woken, and its claim
        tells it the due time exactly (a timer this worker set is claimed when
        due, whatever the poll interval)."""
        running = self._running.get(lease.execution_id)
        if (not isinstance(until, datetime) or running is None
                or running.lease.token != lease.token or running.claimed_at is None):
            return
        # Placed on this loop's clock from the claim's: late by at most the
        # claim's round trip (never early, so a claim then finds it due).
        at = running.started_at + (until - running.claimed_at).total_seconds()
        if self._claim_at is None:
            # The claimer is awake: a claim in flight may have read the due
            # times before this one committed; it waits until this one too.
            self._suspended_due = (at if self._suspended_due is None
                                   else min(self._suspended_due, at))
        elif at < self._claim_at:
            self._wakeup.set()

    def _lose(self, running: Running) -> None:
        """The delivery's token is no longer current: latch it and stop it."""
        running.lost = True
        if running.ctx is not None:
            running.ctx.stop("lease lost", lease_lost=True)
        running.task.cancel()

    def _start(self, delivery: Delivery, steps: dict[str, StepRecord] | None) -> None:
        eid = delivery.lease.execution_id
        stale = self._running.get(eid)
        if stale is not None:
            # Our own earlier lease on it expired and we claimed it again: that
            # delivery is stale (its token is older) and must stop now.
            self.log.info("delivery of %s (token %d) superseded by token %d; stopping it", eid,
                          stale.lease.token, delivery.lease.token, extra=_ids(stale.lease))
            METRICS.leases_lost.inc()
            self._lose(stale)
        task = asyncio.create_task(self._traced(delivery, steps), name=f"delivery {eid}")
        started = time.perf_counter()
        running = self._running[eid] = Running(
            delivery.lease, task, delivery.workflow_id, claimed_at=delivery.claimed_at,
            started_at=asyncio.get_running_loop().time())
        METRICS.in_flight.set(len(self._running))
        if delivery.interrupt is not None and delivery.cleanup_ends is not None:
            # A cleanup delivery: bounded by its window from the start.
            self._bound(running, Interrupt(
                delivery.interrupt, (delivery.cleanup_ends - delivery.claimed_at).total_seconds()))

        def finished(_: asyncio.Task) -> None:
            METRICS.delivery_seconds.labels(delivery.workflow_id).observe(
                time.perf_counter() - started)
            current = self._running.get(eid)
            if current is not None and current.task is task:
                del self._running[eid]
                METRICS.in_flight.set(len(self._running))
                if current.enforcing is not None:
                    current.enforcing.cancel()
            if self._maybe_more_due or delivery.slot_limited:
                self._wakeup.set()

        task.add_done_callback(finished)

    # ---------------------------------------------------------------- delivery

    def _lease_of(self, execution_id: str, lease: Lease) -> Lease:
        """The freshest copy (latest expiry) of this delivery's own lease; never
        another delivery's lease on the same execution."""
        running = self._running.get(execution_id)
        if running is not None and running.lease.token == lease.token:
            return running.lease
        return lease

    async def _traced(self, delivery: Delivery, steps: dict[str, StepRecord] | None) -> None:
        """The delivery under its span, a child of the admission's trace."""
        lease = delivery.lease
        with tracing.span("fencepost delivery", parent=delivery.traceparent, attributes={
                "fencepost.execution_id": lease.execution_id,
                "fencepost.workflow_id": delivery.workflow_id,
                "fencepost.token": lease.token, "fencepost.worker_id": self.worker_id,
                "fencepost.taken_over": delivery.taken_over}):
            await self._deliver(delivery, steps)

    async def _deliver(self, delivery: Delivery, steps: dict[str, StepRecord] | None) -> None:
        lease = delivery.lease
        eid = lease.execution_id
        definition = self.workflows[delivery.workflow_id]
        if steps is None:
            try:
                steps = (await self._db.history.steps([eid])).get(eid, {})
            except Exception as exc:
                if not is_infrastructure(exc):
                    raise
                self.log.warning("delivery of %s (token %d): cannot read its steps (%s)", eid,
                                 lease.token, exc, extra=_ids(lease))
                await self._finish(lease, "retry", error=error_of(exc))
                return
        try:
            params = definition.parse_params(delivery.params)
        except ValidationError as exc:
            await self._finish(lease, "failed", error={
                "name": "InvalidParams",
                "message": f"params no longer match {_model_name(definition)}: {exc}",
            })
            return
        ctx = WorkflowContext(self._db, delivery, steps, definition, params, self.workflows,
                              max_payload_bytes=self.settings.max_payload_bytes)
        running = self._running.get(eid)
        if running is not None and running.lease.token == lease.token:
            running.ctx = ctx
        else:
            running = None
        try:
            result = await definition.fn(ctx, params)
        except Suspend:
            await self._finish(lease, "suspended", waiting_on=ctx.suspended_on)
        except Cancelled as exc:
            await self._finish(lease, "cancelled", error={"name": "Cancelled", "message": str(exc)})
        except DeadlineExceeded as exc:
            await self._finish(lease, "timed_out",
                               error={"name": "DeadlineExceeded", "message": str(exc)})
        except Park as exc:
            await self._finish(lease, "park", step_key=exc.step_key)
        except Nondeterminism as exc:
            await self._finish(lease, "park", divergence=exc.divergence)
        except Retry as exc:
            if ctx.diverged is not None:  # caught the divergence, then asked to retry
                await self._finish(lease, "park", divergence=ctx.diverged)
                return
            await self._finish(lease, "retry", error=error_of(exc))
        except (DeliveryStopped, asyncio.CancelledError) as exc:
            if running is not None and running.forced:
                # Stopped by this worker as its cleanup window closed after a
                # cancel or the deadline (the code's `finally:` may have met the
                # latch meanwhile): the fenced acknowledgement says so.
                kind: Acknowledgement = ("cancelled" if running.forced == "cancel"
                                         else "timed_out")
                await self._finish(lease, kind, error={
                    "name": "Cancelled" if kind == "cancelled" else "DeadlineExceeded",
                    "message": "the workflow code did not finish before its cleanup window "
                               f"closed after the {running.forced}",
                })
                return
            if isinstance(exc, DeliveryStopped):
                self._stopped(lease, str(exc))
                return
            self.log.info("delivery of %s (token %d) cancelled", eid, lease.token,
                          extra=_ids(lease))
            # At shutdown the drain releases the lease; either way no outcome.
        except Exception as exc:
            # fencepost's own database calls surface as DeliveryStopped (see
            # WorkflowContext._fenced); anything else is the workflow's error -
            # unless the code no longer fits the history: it raised past a
            # divergence it caught, or before a recorded step (the history went
            # further), and then it parks like any divergence.
            diverged = ctx.diverged or ctx.divergence_at_end(exc)
            if diverged is not None:
                await self._finish(lease, "park", divergence=diverged)
                return
            await self._finish(lease, "failed", error=error_of(exc), tb=format_traceback(exc))
        else:
            # Returned: a divergence the code swallowed, or a recorded step
            # it never asked for, parks it like one raised.
            diverged = ctx.diverged or ctx.divergence_at_end()
            problem = value_problem(result, self.settings.max_payload_bytes)
            if ctx.interrupt == "deadline":
                # The code caught DeadlineExceeded and returned: still timed out.
                await self._finish(lease, "timed_out", error={
                    "name": "DeadlineExceeded", "message": "the execution's deadline has passed"})
            elif diverged:
                await self._finish(lease, "park", divergence=diverged)
            elif problem is not None:
                fault, why = problem
                await self._finish(lease, "failed", error={
                    "name": "ResultNotJSON" if fault == "not-json" else "ResultTooLarge",
                    "message": f"the workflow returned a value that cannot be recorded: {why}",
                })
            else:
                await self._finish(lease, "completed", result=result)

    def _ended(self, lease: Lease, kind: str, error: dict | None, status: str | None) -> None:
        """One line for a delivery that ended other than completed (the
        normal ends, completed and suspended, log only at debug)."""
        if kind in ("completed", "suspended") and status in (kind, None):
            self.log.debug("delivery of %s (token %d): %s", lease.execution_id, lease.token,
                           kind, extra=_ids(lease))
            return
        name = (error or {}).get("name")
        # The reason of a retry (Retry("why"), a database failure) is said; a
        # failure's message may carry the workflow's values: its name only.
        why = (error or {}).get("message") if kind in ("retry", "park") else None
        level = logging.INFO if kind == "retry" and status is None else logging.WARNING
        self.log.log(level, "delivery of %s (token %d) ended: %s%s%s", lease.execution_id,
                     lease.token, kind, f" ({name}{': ' + why if why else ''})" if name else "",
                     f"; execution now {status}" if status and status != kind else "",
                     extra={**_ids(lease), "kind": "delivery_end", "outcome": kind,
                            "error_name": name, "status": status})

    def _workflow_of(self, lease: Lease) -> str:
        running = self._running.get(lease.execution_id)
        return running.workflow_id if running is not None else ""

    def _stopped(self, lease: Lease, why: str) -> None:
        METRICS.deliveries.labels(self._workflow_of(lease), "stopped").inc()
        self.log.info("delivery of %s (token %d) stopped: %s", lease.execution_id, lease.token,
                      why, extra=_ids(lease))

    async def _finish(self, lease: Lease, kind: Ending, *, result: Any = None,
                      error: dict | None = None, tb: str | None = None,
                      waiting_on: dict | None = None, step_key: str | None = None,
                      divergence: dict | None = None) -> None:
        """The final write of a delivery, shielded from cancellation; the
        drain waits for it rather than release the lease under it. A delivery
        latched stopped writes nothing, whatever its code did after learning
        it (swallowed the stop, raised from a `finally:`, returned)."""
        lease = self._lease_of(lease.execution_id, lease)
        running = self._running.get(lease.execution_id)
        if running is None or running.lease.token != lease.token:
            running = None
        if running is not None and running.ctx is not None and running.ctx.stopped \
                and not running.forced:
            self._stopped(lease, running.ctx.stopped)
            return
        write = asyncio.ensure_future(
            self._write_outcome(lease, kind, result, error, tb, waiting_on, step_key, divergence)
        )
        if running is not None:
            running.finishing = write
        await asyncio.shield(write)

    async def _write_outcome(self, lease: Lease, kind: Ending, result: Any, error: dict | None,
                             tb: str | None, waiting_on: dict | None, step_key: str | None,
                             divergence: dict | None = None) -> None:
        METRICS.deliveries.labels(self._workflow_of(lease), kind).inc()
        try:
            if kind == "retry":
                settled = await self._db.leases.release(lease, reason=error)
                METRICS.unacknowledged_deliveries.inc()
                self._ended(lease, "retry", error, settled)
                return
            if kind == "park" and divergence is not None:
                status = await self._db.effects.park(
                    lease, "nondeterminism", divergence.get("asked") or divergence.get("recorded"),
                    divergence)
                self._ended(lease, "park", {"name": "Nondeterminism",
                                            "message": divergence["message"]}, status)
                return
            if kind == "park":
                # Otherwise a park names the step whose effect's outcome is unknown.
                assert step_key is not None
                status = await self._db.effects.park_outcome_unknown(lease, step_key)
                self._ended(lease, "park", {"name": "OutcomeUnknown",
                                            "message": f"effect {step_key!r}"}, status)
                return
            try:
                ack = await self._db.leases.acknowledge(lease, kind, result=result, error=error,
                                                   traceback=tb, waiting_on=_jsonable(waiting_on))
            except InvalidEvent as exc:
                error = {"name": "ResultNotJSON", "message": f"the result cannot be stored: {exc}"}
                ack = await self._db.leases.acknowledge(lease, "failed", error=error)
            if ack.status == "suspended" and waiting_on is not None:
                self._suspended_until(lease, waiting_on.get("until"))
            self._ended(lease, kind, error, ack.status)
        except LeaseLost:
            METRICS.fenced_writes_rejected.inc()
            METRICS.leases_lost.inc()
            self.log.warning("acknowledgement (%s) of %s (token %d) rejected: a newer token "
                             "holds it", kind, lease.execution_id, lease.token,
                             extra={**_ids(lease), "kind": "fenced_write_rejected",
                                    "write": f"acknowledge {kind}"})
            await keep_late_observation(
                self._db, lease, None, {"acknowledge": kind, "result": result}, error)
        except Exception as exc:
            if not is_infrastructure(exc):
                raise
            self.log.warning("could not acknowledge %s (%s); the lease will expire",
                             lease.execution_id, exc, extra=_ids(lease))

    # ----------------------------------------------------------------- renewer

    async def _renewer(self) -> None:
        backoff = Backoff()
        interval = self.settings.renew_seconds
        while not self._done.is_set():
            try:
                await asyncio.wait_for(self._done.wait(), timeout=interval)
                return
            except TimeoutError:
                pass
            held = {eid: r for eid, r in self._running.items() if not r.lost}
            try:
                renewed, lost, interrupts = await self._control_db.leases.renew_with_interrupts(
                    [r.lease for r in held.values()], self.settings.lease_seconds
                )
                await self._control_db.workers.heartbeat(self.worker_id)
                backoff.reset()
                interval = self.settings.renew_seconds
            except Exception as exc:
                if not is_infrastructure(exc):
                    raise
                interval = min(self.settings.renew_seconds, backoff.next())
                self.log.warning("renewal failed (%s); retrying in %.2fs", exc, interval)
                continue
            METRICS.renewals.inc(len(renewed))
            for lease in renewed:
                running = self._running.get(lease.execution_id)
                if running is not None and running.lease.token == lease.token:
                    running.lease = lease
                    interrupt = interrupts.get(lease.execution_id)
                    if interrupt is not None:
                        self._bound(running, interrupt)
            for lease in lost:
                running = self._running.get(lease.execution_id)
                if running is not None and running.lease.token == lease.token:
                    METRICS.leases_lost.inc()
                    self.log.info("lease on %s (token %d) lost at renewal; stopping its delivery",
                                  lease.execution_id, lease.token, extra=_ids(lease))
                    self._lose(running)

    def _bound(self, running: Running, interrupt: Interrupt) -> None:
        """A cancel was requested or the deadline passed: the code meets it at
        its next step or wait and may clean up until its window closes (the
        lease is not extended past that); if the code has not finished one
        renewal interval before then (a step that never returns), the
        delivery is stopped and ended cancelled / timed out through a fenced
        acknowledgement."""
        if running.ctx is not None:
            running.ctx.notice(interrupt.kind)
        if running.enforcing is not None:
            return
        delay = max(0.0, interrupt.remaining - self.settings.renew_seconds)
        running.enforcing = asyncio.get_running_loop().call_later(
            delay, self._force_stop, running, interrupt.kind)

    def _force_stop(self, running: Running, kind: str) -> None:
        if running.task.done() or running.finishing is not None or running.lost:
            return
        self.log.info("delivery of %s (token %d) did not stop after the %s; stopping it",
                      running.lease.execution_id, running.lease.token, kind,
                      extra=_ids(running.lease))
        running.forced = kind
        if running.ctx is not None:
            running.ctx.stop(f"stopped by the worker after the {kind}")
        running.task.cancel()

    # ---------------------------------------------------------------- listener

    def _woken(self) -> None:
        """A NOTIFY: something became due; the claim looks everywhere again."""
        self._db.leases.wake_claims()
        self._wakeup.set()

    async def _listener(self) -> None:
        """LISTEN for admissions, wakes and signals; polling covers the rest."""
        backoff = Backoff(first=0.5, cap=10.0)
        # run() opened its pools from this URL first: it is set.
        assert self.settings.database_url is not None
        dsn = asyncpg_dsn(self.settings.database_url)
        while not self._done.is_set():
            conn = None
            try:
                conn = await asyncpg.connect(dsn, timeout=self.settings.connect_timeout_seconds)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda *_, closed=closed: closed.set())
                await conn.add_listener(NOTIFY_CHANNEL, lambda *_: self._woken())
                backoff.reset()
                self._wakeup.set()  # anything admitted while we were not listening
                while not self._done.is_set():
                    done = asyncio.ensure_future(self._done.wait())
                    lost = asyncio.ensure_future(closed.wait())
                    await asyncio.wait({done, lost}, timeout=5.0,
                                       return_when=asyncio.FIRST_COMPLETED)
                    done.cancel()
                    lost.cancel()
                    if closed.is_set():
                        raise ConnectionError("the LISTEN connection was closed")
                    if not self._done.is_set():  # a half-open socket shows up here
                        await conn.execute("SELECT 1", timeout=5.0)
            except _LISTEN_LOST as exc:
                delay = backoff.next()
                self.log.warning("listener connection lost (%s); reconnecting in %.2fs", exc, delay)
                await asyncio.sleep(delay)
            finally:
                if conn is not None:
                    conn.terminate()

    # ------------------------------------------------------------------ reaper

    async def _maintain(self, service: LeaseReaper | RetentionPruner | Scheduler
                        | OperationRunner | Leadership,
                        leadership: Leadership | None = None) -> None:
        """Run a maintenance service (while this worker leads its role, with
        `leadership`), or hold a role's lease, until the worker is done,
        riding out outages."""
        backoff = Backoff()
        while not self._done.is_set():
            try:
                if isinstance(service, Leadership):
                    await service.hold(self._done)
                else:
                    await service.run(self._done, leadership)
                return
            except Exception as exc:
                if not is_infrastructure(exc):
                    raise
                delay = backoff.next()
                self.log.warning("%s failed (%s); retrying in %.2fs", type(service).__name__, exc,
                                 delay)
                await asyncio.sleep(delay)


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True
