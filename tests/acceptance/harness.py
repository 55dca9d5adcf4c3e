"""A small harness for acceptance tests with real `fencepost worker` processes.

    h = Harness(database_url, tmp_dir)
    await h.open()
    a = await h.start_worker("A", concurrency=2)      # returns once A is in `workers`
    await h.admit("acc-1", {"steps": [...]})
    await h.wait_for(lambda: h.started("acc-1", "two", pid=a.pid), what="A inside step two")
    a.signal(signal.SIGKILL)
    ...
    await h.close()                                   # kills leftovers (SIGCONT first)

Every worker runs `python -m app.cli worker` with the repository root on
PYTHONPATH (so `tests.acceptance.flows` imports), short timing settings
(lease 2 s, renew 0.5 s, poll 0.2 s, redelivery 0.1 s..1 s, grace 5 s; each can
be overridden per worker) and its stdout+stderr in `<tmp>/logs/<name>.log`.
`h.logs()` returns every log, for dumping when a test fails (the `harness`
fixture in conftest.py does that).

Step functions in flows.py leave files in `<tmp>/marks`; `h.calls()` reads them.
Database reads go through `h.store` (ExecutionStore: healed reads) and a few
plain SQL helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import asyncpg

from app.db import create_pool
from app.settings import Settings
from app.store import ExecutionStore

REPO_ROOT = Path(__file__).resolve().parents[2]
FLOWS_MODULE = "tests.acceptance.flows"

# Short timings so a lost lease is taken over in about two seconds.
DEFAULT_SETTINGS: dict[str, str] = {
    "FENCEPOST_LEASE_SECONDS": "2",
    "FENCEPOST_RENEW_SECONDS": "0.5",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_REDELIVERY_BASE_SECONDS": "0.1",
    "FENCEPOST_REDELIVERY_CAP_SECONDS": "1",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "5",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "2",
}
LEASE_SECONDS = float(DEFAULT_SETTINGS["FENCEPOST_LEASE_SECONDS"])

TERMINAL = ("completed", "failed", "cancelled", "timed_out")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class WorkerProcess:
    name: str
    worker_id: str
    proc: subprocess.Popen
    log_path: Path
    _log_file: TextIO = field(repr=False)
    stopped: bool = False  # SIGSTOPped and not continued since

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        """The exit code; AssertionError if the process is still running after `timeout`."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} (pid {self.pid}) still running "
                                     f"after {timeout:.1f}s")
            await asyncio.sleep(0.02)
        return self.proc.returncode

    def log(self) -> str:
        with contextlib.suppress(Exception):
            self._log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGCONT (a stopped process cannot die until continued) then SIGKILL."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.stopped = False
        with contextlib.suppress(Exception):
            self._log_file.close()


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

    def spawn_worker(self, name: str, *, concurrency: int = 4,
                     settings: dict[str, Any] | None = None) -> WorkerProcess:
        """Start a worker process; it may not have registered yet."""
        worker_id = f"acc-worker-{name}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
        env.update(DEFAULT_SETTINGS)
        env.update({k: str(v) for k, v in (settings or {}).items()})
        env["DATABASE_URL"] = self.database_url
        env["ACC_MARK_DIR"] = str(self.mark_dir)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "a")  # noqa: SIM115 - closed by WorkerProcess.kill
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--concurrency", str(concurrency),
             "--workflows", FLOWS_MODULE, "--worker-id", worker_id, "--log-level", "info"],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        w = WorkerProcess(name, worker_id, proc, log_path, log_file)
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
        async def registered() -> bool:
            if not w.alive():
                raise AssertionError(f"worker {w.name} exited with {w.returncode} before "
                                     f"registering:\n{w.log()}")
            row = await self.pool.fetchrow(
                "SELECT pid, stopped_at FROM workers WHERE worker_id = $1", w.worker_id
            )
            return row is not None and row["pid"] == w.pid and row["stopped_at"] is None

        await self.wait_for(registered, timeout=timeout, what=f"worker {w.name} registered")

    # ------------------------------------------------------------------ waiting

    async def wait_for(self, predicate: Callable[[], Awaitable[Any] | Any], *, timeout: float,
                       what: str, interval: float = 0.05, tolerate_db_errors: bool = False) -> Any:
        """Poll `predicate` (sync or async) until it returns something truthy; return it."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            try:
                value = predicate()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if not tolerate_db_errors:
                    raise
                last_error = exc
            if time.monotonic() > deadline:
                extra = f" (last error: {last_error!r})" if last_error else ""
                raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")
            await asyncio.sleep(interval)

    # ---------------------------------------------------------------- workflows

    async def admit(self, execution_id: str, params: dict, workflow_id: str = "acc-steps") -> None:
        answer = await self.store.admit(workflow_id=workflow_id, params=params,
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
        rec = await self.store.get(eid)
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
        return await self.store.events(eid)

    async def late_observations(self, eid: str) -> list[dict]:
        return await self.store.late_observations(eid)

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
