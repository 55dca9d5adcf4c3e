"""A small harness for tests with real `fencepost worker` processes (crashed,
paused, stopped, their database restarted: tests/worker_processes, and the
folders that borrow it).

    h = Harness(database_url, tmp_dir)
    await h.open()
    a = await h.start_worker("A", concurrency=2)      # returns once A is in `workers`
    await h.admit("acc-1", {"steps": [...]})
    await h.wait_for(lambda: h.started("acc-1", "two", pid=a.pid), what="A inside step two")
    a.signal(signal.SIGKILL)
    ...
    await h.close()                                   # kills leftovers (SIGCONT first)

Every worker runs `python -m app.cli worker` with the repository root on
PYTHONPATH (so `tests.worker_processes.flows` imports), short timing settings
(lease 2 s, renew 0.5 s, poll 0.2 s, redelivery 0.1 s..1 s, grace 5 s; each can
be overridden per worker) and its stdout+stderr in `<tmp>/logs/<name>.log`.
`h.logs()` returns every log, for dumping when a test fails (`make_harness`
and `opened` below do that; a conftest imports this module's report hook,
`pytest_runtest_makereport`, so they can tell).

Step functions in flows.py leave files in `<tmp>/marks`; `h.calls()` reads them.
Database reads go through `h.store` (ExecutionStore: healed reads) and a few
plain SQL helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from app.db import create_pool
from app.settings import Settings
from app.store import ExecutionStore
from tests.support.processes import (  # noqa: F401 - re-exported for the tests
    REPO_ROOT,
    WorkerProcess,
    is_registered,
    spawn_worker,
)
from tests.support.waiting import DB_ERRORS, wait_until

FLOWS_MODULE = "tests.worker_processes.flows"

# Short timings so a lost lease is taken over in about two seconds.
DEFAULT_SETTINGS: dict[str, str] = {
    "FENCEPOST_LEASE_SECONDS": "2",
    "FENCEPOST_RENEW_SECONDS": "0.5",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_REDELIVERY_BASE_SECONDS": "0.1",
    "FENCEPOST_REDELIVERY_CAP_SECONDS": "1",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "5",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "2",
    # Cleanup after a cancel or the deadline, for workflows without cancel_grace=.
    "FENCEPOST_CANCEL_GRACE_SECONDS": "2",
}
LEASE_SECONDS = float(DEFAULT_SETTINGS["FENCEPOST_LEASE_SECONDS"])
CANCEL_GRACE_SECONDS = float(DEFAULT_SETTINGS["FENCEPOST_CANCEL_GRACE_SECONDS"])

TERMINAL = ("completed", "failed", "cancelled", "timed_out")


class Harness:
    def __init__(self, database_url: str, tmp_dir: Path):
        self.database_url = database_url
        self.tmp_dir = Path(tmp_dir)
        self.log_dir = self.tmp_dir / "logs"
        self.mark_dir = self.tmp_dir / "marks"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.mark_dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[WorkerProcess] = []
        self.pool: asyncpg.Pool | None = None
        self.store: ExecutionStore | None = None

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> Harness:
        settings = Settings(
            database_url=self.database_url,
            redelivery_base_seconds=float(DEFAULT_SETTINGS["FENCEPOST_REDELIVERY_BASE_SECONDS"]),
            redelivery_cap_seconds=float(DEFAULT_SETTINGS["FENCEPOST_REDELIVERY_CAP_SECONDS"]),
            connect_timeout_seconds=2,
        )
        self.pool = await create_pool(settings, min_size=1, max_size=4)
        self.store = ExecutionStore.from_settings(self.pool, settings)
        return self

    async def close(self) -> None:
        for w in self.workers:
            w.kill()
        pool, self.pool = self.pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=5)
            except Exception:
                pool.terminate()

    def logs(self) -> str:
        parts = []
        for w in self.workers:
            parts.append(f"===== worker {w.name} ({w.worker_id}, pid {w.pid}, "
                         f"exit {w.returncode}) {w.log_path} =====\n{w.log()}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- workers

    # The workflows its workers run, and their IDs' prefix (a subclass may change both).
    flows_module = FLOWS_MODULE
    worker_prefix = "acc-worker"

    def spawn_worker(self, name: str, *, concurrency: int = 4,
                     settings: dict[str, Any] | None = None) -> WorkerProcess:
        """Start a worker process; it may not have registered yet."""
        w = spawn_worker(
            name, database_url=self.database_url, flows_module=self.flows_module,
            log_dir=self.log_dir, worker_id=f"{self.worker_prefix}-{name}",
            concurrency=concurrency, settings={**DEFAULT_SETTINGS, **(settings or {})},
            extra_env={"ACC_MARK_DIR": str(self.mark_dir)},
        )
        self.workers.append(w)
        return w

    async def start_worker(self, name: str, *, concurrency: int = 4,
                           settings: dict[str, Any] | None = None,
                           timeout: float = 20.0) -> WorkerProcess:
        """Start a worker and return once it is registered in `workers`."""
        w = self.spawn_worker(name, concurrency=concurrency, settings=settings)
        await self.wait_registered(w, timeout=timeout)
        return w

    async def wait_registered(self, w: WorkerProcess, timeout: float = 20.0) -> None:
        await self.wait_for(lambda: is_registered(self.pool, w), timeout=timeout,
                            what=f"worker {w.name} registered")

    # ------------------------------------------------------------------ waiting

    async def wait_for(self, predicate: Callable[[], Awaitable[Any] | Any], *, timeout: float,
                       what: str, interval: float = 0.05, tolerate_db_errors: bool = False) -> Any:
        """Poll `predicate` (sync or async) until it returns something truthy; return it.
        With `tolerate_db_errors`, a database that is down counts as "not yet"."""
        return await wait_until(predicate, timeout=timeout, what=what, interval=interval,
                                tolerate=DB_ERRORS if tolerate_db_errors else ())

    # ---------------------------------------------------------------- workflows

    async def admit(self, execution_id: str, params: dict, workflow_id: str = "acc-steps") -> None:
        answer = await self.store.admissions.admit(workflow_id=workflow_id, params=params,
                                        execution_id=execution_id)
        assert getattr(answer, "status", None) == "admitted", answer

    def calls(self, eid: str | None = None, step: str | None = None, *,
              event: str = "start") -> list[dict]:
        """Step-function events written by flows.run_step, oldest first."""
        out = []
        for path in self.mark_dir.glob(f"{event}-*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (eid is None or data["eid"] == eid) and (step is None or data["step"] == step):
                out.append(data)
        return sorted(out, key=lambda d: d["at"])

    def started(self, eid: str, step: str, *, pid: int | None = None) -> bool:
        return any(pid is None or c["pid"] == pid for c in self.calls(eid, step))

    # -------------------------------------------------------------------- reads

    async def record(self, eid: str) -> dict:
        """The healed record, as GET /v1/executions/{id} reports it."""
        rec = await self.store.history.get(eid)
        assert rec is not None, f"no execution {eid}"
        return rec

    async def status(self, eid: str) -> str:
        return (await self.record(eid))["status"]

    async def has_status(self, eid: str, *statuses: str) -> bool:
        return (await self.status(eid)) in statuses

    async def steps(self, eid: str) -> list[dict]:
        rows = await self.pool.fetch(
            "SELECT step_key, status, value, token FROM execution_steps "
            "WHERE execution_id = $1 ORDER BY step_key", eid)
        return [dict(r) for r in rows]

    async def events(self, eid: str) -> list[dict]:
        return await self.store.history.events(eid)

    async def late_observations(self, eid: str) -> list[dict]:
        return await self.store.history.late_observations(eid)

    async def statuses(self, eids: list[str]) -> dict[str, str]:
        rows = await self.pool.fetch(
            "SELECT execution_id, status FROM executions WHERE execution_id = ANY($1::text[])",
            eids)
        return {r["execution_id"]: r["status"] for r in rows}

    async def all_terminal(self, eids: list[str]) -> bool:
        statuses = await self.statuses(eids)
        return len(statuses) == len(eids) and all(s in TERMINAL for s in statuses.values())

    # --------------------------------------------------------------- invariants

    async def assert_recorded_once(self, eid: str, keys: list[str]) -> list[dict]:
        """Each step recorded exactly once (one row, one 'step_recorded' event),
        and at most one acknowledgement with a terminal status. Returns the events."""
        steps = await self.steps(eid)
        assert sorted(s["step_key"] for s in steps) == sorted(keys), (eid, steps)
        events = await self.events(eid)
        recorded = Counter(e["detail"]["stepKey"] for e in events if e["kind"] == "step_recorded")
        assert recorded == Counter(keys), (eid, recorded)
        terminal_acks = [e for e in events if e["kind"] == "acknowledged"
                         and (e["detail"] or {}).get("status") in TERMINAL]
        assert len(terminal_acks) <= 1, (eid, terminal_acks)
        return events


def steps_spec(*keys: str, seconds: float = 0.0, **overrides: dict) -> dict:
    """Params for acc-steps: `keys` in order, each taking `seconds`; per-key
    overrides as keyword arguments, e.g. two={"block_first": 30}."""
    return {"steps": [{"key": k, "seconds": seconds, **overrides.get(k, {})} for k in keys]}


@contextlib.asynccontextmanager
async def opened(harness: Harness, request) -> AsyncIterator[Harness]:
    """`harness` open for one test: closed after it (its workers killed), and
    its workers' logs printed when the test failed (`request`: the test's
    fixture request; this module's report hook must be loaded by a conftest)."""
    await harness.open()
    try:
        yield harness
    finally:
        await harness.close()
        report = getattr(request.node, REPORT_ATTR + "call", None)
        if report is None or report.failed:
            print(harness.logs())


# The test's report of each phase, kept on its item by the hook below, so the
# teardown can tell a failed test (print the workers' logs) from a passed one.
REPORT_ATTR = "_harness_report_"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"{REPORT_ATTR}{report.when}", report)
    return report


@pytest_asyncio.fixture
async def make_harness(request, tmp_path) -> AsyncIterator[Callable]:
    """`await make_harness(url)`: an open Harness on any database (e.g. an embedded
    server the test restarts); every one is closed after the test (its workers
    killed, SIGCONT first), and their logs printed when the test failed."""
    made: list[Harness] = []

    async def make(url: str) -> Harness:
        h = Harness(url, tmp_path / f"h{len(made)}")
        made.append(h)
        return await h.open()

    try:
        yield make
    finally:
        for h in made:
            await h.close()
        report = getattr(request.node, REPORT_ATTR + "call", None)
        if report is None or report.failed:
            for h in made:
                print(h.logs())
