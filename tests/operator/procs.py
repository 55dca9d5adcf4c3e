"""Real `fencepost worker` processes for the operator tests.

    w = await procs.start("A", concurrency=4)   # returns once A is registered
    w.send(signal.SIGKILL); await w.wait_exit(5)

Each worker runs `python -m app.cli worker --workflows tests.operator.flows`
with the repository root on PYTHONPATH, DATABASE_URL of the test's database and
short FENCEPOST_* timings (lease 1 s, renew 0.2 s, poll 0.2 s, redelivery
0.05 s .. 0.2 s; overridable per worker). stdout+stderr go to `<logs>/<name>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import asyncpg

REPO_ROOT = Path(__file__).resolve().parents[2]
FLOWS_MODULE = "tests.operator.flows"

SETTINGS: dict[str, str] = {
    "FENCEPOST_LEASE_SECONDS": "1",
    "FENCEPOST_RENEW_SECONDS": "0.2",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_REDELIVERY_BASE_SECONDS": "0.05",
    "FENCEPOST_REDELIVERY_CAP_SECONDS": "0.2",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "1",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "2",
}
LEASE_SECONDS = float(SETTINGS["FENCEPOST_LEASE_SECONDS"])


def _die_with_parent() -> None:  # in the child, between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Proc:
    name: str
    worker_id: str
    proc: subprocess.Popen
    log_path: Path
    _log: TextIO = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} still running after {timeout}s")
            await asyncio.sleep(0.02)
        return self.proc.returncode

    def log(self) -> str:
        with contextlib.suppress(Exception):
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped process dies only when continued
                self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        with contextlib.suppress(Exception):
            self._log.close()


class Procs:
    def __init__(self, database_url: str, log_dir: Path, pool: asyncpg.Pool):
        self.database_url = database_url
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pool = pool
        self.all: list[Proc] = []

    def spawn(self, name: str, *, concurrency: int = 8,
              settings: dict[str, Any] | None = None) -> Proc:
        worker_id = f"op-worker-{name}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
        env.update(SETTINGS)
        env.update({k: str(v) for k, v in (settings or {}).items()})
        env["DATABASE_URL"] = self.database_url
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "a")  # noqa: SIM115 - closed by Proc.kill
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--concurrency", str(concurrency),
             "--workflows", FLOWS_MODULE, "--worker-id", worker_id, "--log-level", "info"],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        p = Proc(name, worker_id, proc, log_path, log)
        self.all.append(p)
        return p

    async def start(self, name: str, *, concurrency: int = 8,
                    settings: dict[str, Any] | None = None) -> Proc:
        """Spawn a worker and return once it has registered (pid matches)."""
        p = self.spawn(name, concurrency=concurrency, settings=settings)

        async def registered() -> bool:
            if not p.alive():
                raise AssertionError(f"worker {name} exited before registering:\n{p.log()}")
            row = await self.pool.fetchrow(
                "SELECT pid, stopped_at FROM workers WHERE worker_id = $1", p.worker_id)
            return row is not None and row["pid"] == p.pid and row["stopped_at"] is None

        await wait_for(registered, timeout=20, what=f"worker {name} registered")
        return p

    def kill_all(self) -> None:
        for p in self.all:
            p.kill()

    def logs(self) -> str:
        return "\n".join(
            f"===== worker {p.name} (pid {p.pid}, exit {p.proc.poll()}) =====\n{p.log()}"
            for p in self.all)


async def wait_for(predicate: Callable[[], Awaitable[Any] | Any], *, timeout: float, what: str,
                   interval: float = 0.03) -> Any:
    """Poll `predicate` (sync or async) until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)
