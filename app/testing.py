"""`app.testing`: run workflows in a test, against a real Postgres, with time skipping.

    from datetime import timedelta
    from app.testing import WorkflowEnvironment
    import app.examples.refunds as refunds

    async def test_refund_times_out(database_url):
        async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
            eid = await env.start("approve-refund", {"order_id": 1, "amount_cents": 500,
                                                     "approval_timeout_seconds": 7 * 86400})
            await env.wait_suspended(eid)
            await env.skip(timedelta(days=7))
            assert (await env.result(eid))["reason"] == "no decision in time"

What it is: a real in-process `Worker` (the same code `fencepost worker`
runs: claims, leases, fenced step writes, replays) on the database of
`database_url` (a migrated, throw-away test database: the `database_url`
fixture of tests/conftest.py, or any database `fencepost migrate` prepared).

Time skipping. The database clock (`now()`) is the only clock of the
service, so the environment never changes it. `env.skip(d)` moves every time
recorded for the executions this environment started (and their children)
`d` into the past, in one statement: wakes, recorded timer steps (sleeps and
signal timeouts), deadlines, lease and redelivery times. For those executions
that is exactly the clock moving `d` forward; other executions in the
database are untouched. `skip` first waits until the environment is idle
(nothing running or due now), because moving time under a held lease would
lapse it, as a real week-long step would; then it wakes the worker and runs
one reaper pass (deadlines) at once. `env.result(eid, skip_time=True)` does
what Temporal's time-skipping environment does: while the execution waits on
a timer and nothing else is due, it skips straight to the next wake.

Stand-ins for effect and step functions: `env.replace(fn, fake)` swaps `fn`
wherever the workflow modules reach it (a module-level function of those
modules, or a bound method such as `payments.charge`, replaced on its
instance) until the environment closes; `env.replace(obj, "name", fake)` sets
any attribute. Replace before `start`: the workflow looks the function up
when it calls it, and a replayed step returns its recorded value without
calling anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from app.db import create_pool
from app.reaper import LeaseReaper
from app.registry import WorkflowDefinition, load_workflows
from app.sdk import SignalSender
from app.settings import Settings
from app.store import Admitted, ExecutionStore
from app.store.records import HealedExecution
from app.worker import Worker

__all__ = ["ExecutionFailed", "WorkflowEnvironment", "TERMINAL"]

TERMINAL = ("completed", "failed", "cancelled", "timed_out")
_MISSING = object()


class ExecutionFailed(Exception):  # noqa: N818 - named for what happened
    """`env.result()` of an execution that ended other than `completed`:
    `status` ("failed", "cancelled", "timed_out") and the recorded `error`
    ({"name", "message", ...})."""

    def __init__(self, execution_id: str, status: str, error: dict[str, Any] | None):
        self.execution_id, self.status, self.error = execution_id, status, error or {}
        super().__init__(f"{execution_id} ended {status}: {self.error.get('name')}: "
                         f"{self.error.get('message')}")


class WorkflowEnvironment:
    """An in-process worker on a test database, with time skipping, signals
    and stand-ins. Use as `async with WorkflowEnvironment(url, workflows=[module]) as env`."""

    def __init__(self, database_url: str, *, workflows: Iterable[types.ModuleType | str],
                 concurrency: int = 8, settings: Settings | None = None,
                 worker_id: str | None = None):
        modules = [m if isinstance(m, str) else m.__name__ for m in workflows]
        self.workflows: dict[str, WorkflowDefinition] = load_workflows(modules)
        if not self.workflows:
            raise ValueError(f"modules {modules} register no workflow")
        self._modules = [__import__(m, fromlist=["_"]) for m in modules]
        # Quick polls: a test waits on conditions, not on timers. (Lease and
        # redelivery times stay the defaults: every process on a database must
        # share them, and an API started on the same database has the defaults.)
        self.settings = settings or Settings(database_url=database_url, poll_seconds=0.05)
        self.concurrency = concurrency
        self.worker_id = worker_id or f"test-env-{uuid.uuid4().hex[:8]}"
        self.started: list[str] = []
        self.skipped = timedelta(0)  # total time skipped so far
        self._replaced: list[tuple[Any, str, Any]] = []
        self._pool: asyncpg.Pool | None = None
        self._store: ExecutionStore | None = None
        self.worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def store(self) -> ExecutionStore:
        """The store on the environment's pool, from `async with` on."""
        if self._store is None:
            raise RuntimeError("the environment is not open: use `async with WorkflowEnvironment(...)`")
        return self._store

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> WorkflowEnvironment:
        self._pool = pool = await create_pool(self.settings, min_size=1, max_size=4)
        self._store = ExecutionStore.from_settings(pool, self.settings)
        self.worker = Worker(self.settings, self.workflows, concurrency=self.concurrency,
                             worker_id=self.worker_id)
        self._task = asyncio.create_task(self.worker.run(), name=f"worker {self.worker_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.worker is not None:
                self.worker.request_stop()
            if self._task is not None:
                try:
                    await asyncio.wait_for(self._task, self.settings.shutdown_grace_seconds + 5)
                except Exception:
                    self._task.cancel()
                    with contextlib.suppress(BaseException):
                        await self._task
        finally:
            self._restore()
            if self._pool is not None:
                await self._pool.close()

    def _check_worker(self) -> None:
        if self._task is not None and self._task.done():
            exc = None if self._task.cancelled() else self._task.exception()
            raise RuntimeError(f"the environment's worker stopped: {exc!r}") from exc

    # ------------------------------------------------------------ executions

    async def start(self, workflow_id: str, params: Any = None, *, execution_id: str | None = None,
                    timeout: float | timedelta | None = None, deadline: datetime | None = None,
                    context: dict[str, Any] | None = None) -> str:
        """Admit an execution as the API does (params validated by the
        workflow's model, its default `timeout=`, its `version`); returns its ID."""
        definition = self.workflows.get(workflow_id)
        if definition is None:
            raise KeyError(f"workflow {workflow_id!r} is not in this environment: {sorted(self.workflows)}")
        raw = {} if params is None else params
        definition.parse_params(raw)  # the API's 422, raised here as ValidationError
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is None and deadline is None:
            timeout = definition.timeout_seconds
        eid = execution_id or f"{workflow_id}-{uuid.uuid4().hex[:8]}"
        answer = await self.store.admissions.admit(workflow_id=workflow_id, params=raw, execution_id=eid,
                                        context=context, deadline=deadline, timeout_seconds=timeout,
                                        code_version=definition.version)
        if not isinstance(answer, Admitted):
            raise ValueError(f"execution ID {eid!r} is taken: {answer}")
        self.started.append(eid)
        return eid

    async def signal(self, execution_id: str, name: str, payload: Any = None, *,
                     sender: SignalSender | None = None) -> None:
        """Send signal `name`, as the API would for `sender` (default: an
        operator, `SignalSender(None, "anonymous", "operate")`, what an API
        without authentication records). A workflow's `signals=` restriction
        applies: a sender without the role raises PermissionError."""
        sender = sender or SignalSender(token_id=None, name="anonymous", role="operate")
        record = await self.store.history.get(execution_id)
        if record is None:
            raise KeyError(f"no execution {execution_id!r}")
        definition = self.workflows.get(record["workflow_id"])
        if definition is not None and not definition.may_signal(name, {sender.role}):
            raise PermissionError(f"{record['workflow_id']!r} does not accept signal {name!r} "
                                  f"from role {sender.role!r}")
        answer, detail = await self.store.signals.send_signal(
            execution_id, name, payload, sender=sender)
        if answer != "received":
            raise RuntimeError(f"signal {name!r} to {execution_id!r} not delivered: {answer} {detail}")

    async def cancel(self, execution_id: str) -> Any:
        """Request cancellation, as `POST /v1/executions/{id}/cancel` does:
        the workflow's cleanup runs in the environment's worker."""
        return await self.store.operator.request_cancel(execution_id, by="test")

    async def terminate(self, execution_id: str) -> Any:
        """Cancel with no code run, as `POST /v1/executions/{id}/terminate` does."""
        return await self.store.operator.terminate(execution_id, by="test")

    async def get(self, execution_id: str) -> HealedExecution:
        record = await self.store.history.get(execution_id)
        if record is None:
            raise KeyError(f"no execution {execution_id!r}")
        return record

    async def wait_status(self, execution_id: str, *statuses: str,
                          timeout: float = 10.0) -> HealedExecution:
        """The record once its status is one of `statuses` (wall-clock `timeout`)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            self._check_worker()
            record = await self.get(execution_id)
            if record["status"] in statuses:
                return record
            if loop.time() > end:
                raise TimeoutError(f"{execution_id} still {record['status']!r} after {timeout}s; "
                                   f"wanted {statuses}")
            await asyncio.sleep(0.01)

    async def wait_suspended(self, execution_id: str, timeout: float = 10.0) -> HealedExecution:
        """Once the execution waits (a sleep, a signal, a child) or has ended."""
        return await self.wait_status(execution_id, "suspended", *TERMINAL, timeout=timeout)

    async def result(self, execution_id: str, *, timeout: float = 10.0, skip_time: bool = False) -> Any:
        """The workflow's return value once `completed`; ExecutionFailed for
        any other end. With `skip_time=True`, whenever the environment is idle
        and this execution waits on a timer, time skips to its next wake."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            self._check_worker()
            record = await self.get(execution_id)
            if record["status"] in TERMINAL:
                outcome = record.get("outcome") or {}
                if record["status"] == "completed":
                    return outcome.get("result")
                raise ExecutionFailed(execution_id, record["status"], outcome.get("error"))
            if loop.time() > end:
                raise TimeoutError(f"{execution_id} still {record['status']!r} after {timeout}s")
            if skip_time and await self._idle():
                wake = await self._next_wake()
                if wake is not None:
                    await self._shift(wake)
                    continue
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------ time

    async def skip(self, duration: timedelta | float, *, timeout: float = 10.0) -> None:
        """Let `duration` pass for this environment's executions, at once:
        wait until nothing of theirs is running or due, move their recorded
        times `duration` back, wake the worker, sweep deadlines."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        if seconds < 0:
            raise ValueError("time only moves forward")
        await self.wait_idle(timeout=timeout)
        await self._shift(seconds)

    async def wait_idle(self, timeout: float = 10.0) -> None:
        """Until none of this environment's executions is running or due now."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not await self._idle():
            self._check_worker()
            if loop.time() > end:
                raise TimeoutError(f"the environment is still busy after {timeout}s: "
                                   f"{await self.store.clock.family_statuses(self.started)}")
            await asyncio.sleep(0.01)

    async def _idle(self) -> bool:
        return not self.started or await self.store.clock.family_busy(self.started) == 0

    async def _next_wake(self) -> float | None:
        """Seconds until the earliest pending wake or deadline of the family, or None."""
        return await self.store.clock.family_next_wake(self.started)

    async def _shift(self, seconds: float) -> None:
        if self.started:
            if seconds > 0:
                await self.store.clock.shift_family_times(self.started, seconds)
            await LeaseReaper(self.store).run_once()  # deadlines now passed end at once
        self.skipped += timedelta(seconds=seconds)

    # ------------------------------------------------------------ stand-ins

    def replace(self, target: Any, name_or_fake: Any, fake: Any = _MISSING) -> None:
        """`replace(fn, fake)`: calls the workflows make to `fn` go to `fake`
        (a module-level name of the workflow modules bound to `fn`, or a bound
        method, replaced on its instance). `replace(obj, "name", fake)`: set
        any attribute. Undone when the environment closes."""
        if fake is not _MISSING:
            self._set(target, name_or_fake, fake)
            return
        fn, fake = target, name_or_fake
        done = 0
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            self._set(owner, fn.__name__, fake)
            done += 1
        for module in self._modules:
            for mod in self._submodules(module):
                for name, value in list(vars(mod).items()):
                    if value is fn:
                        self._set(mod, name, fake)
                        done += 1
        if not done:
            raise LookupError(f"{fn!r} is not reachable from {[m.__name__ for m in self._modules]}; "
                              "use replace(obj, 'name', fake)")

    @staticmethod
    def _submodules(module: types.ModuleType) -> list[types.ModuleType]:
        import sys

        prefix = module.__name__ + "."
        return [module] + [m for n, m in list(sys.modules.items())
                           if n.startswith(prefix) and isinstance(m, types.ModuleType)]

    def _set(self, obj: Any, name: str, value: Any) -> None:
        self._replaced.append((obj, name, obj.__dict__.get(name, _MISSING)
                               if hasattr(obj, "__dict__") else getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    def _restore(self) -> None:
        while self._replaced:
            obj, name, old = self._replaced.pop()
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
