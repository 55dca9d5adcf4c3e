"""Real `fencepost worker` processes for tests: start one, signal it (SIGKILL,
SIGSTOP/SIGCONT, SIGTERM), read its log, and always kill it in teardown
(continuing a stopped one first). Used by the worker-process, operator and
compose suites, each with its own workflows module and timings."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import asyncpg

from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


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
        """Send `sig`; SIGSTOP/SIGCONT are remembered so teardown can continue it."""
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        """The exit code; AssertionError if the process is still running after `timeout`."""
        await wait_until(lambda: self.proc.poll() is not None, timeout=timeout, interval=0.02,
                         what=f"worker {self.name} (pid {self.pid}) to exit")
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

    send = signal


def spawn_worker(name: str, *, database_url: str, flows_module: str, log_dir: Path,
                 worker_id: str, concurrency: int, settings: dict[str, Any],
                 extra_env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> WorkerProcess:
    """Start `python -m app.cli worker` for `flows_module` with the repository
    root on PYTHONPATH, only the given FENCEPOST_* settings (none inherited),
    and stdout+stderr in `<log_dir>/<name>.log`; it may not have registered yet."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
    env.update({k: str(v) for k, v in settings.items()})
    env.update(extra_env or {})
    env["DATABASE_URL"] = database_url
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    log_path = Path(log_dir) / f"{name}.log"
    log_file = open(log_path, "a")  # noqa: SIM115 - closed by WorkerProcess.kill
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--concurrency", str(concurrency),
         "--workflows", flows_module, "--worker-id", worker_id, "--log-level", "info", *args],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    return WorkerProcess(name, worker_id, proc, log_path, log_file)


async def is_registered(pool: asyncpg.Pool, w: WorkerProcess) -> bool:
    """True once `w` (this very process) is in `workers`; fails if it died first."""
    if not w.alive():
        raise AssertionError(f"worker {w.name} exited with {w.returncode} before "
                             f"registering:\n{w.log()}")
    row = await pool.fetchrow("SELECT pid, stopped_at FROM workers WHERE worker_id = $1",
                              w.worker_id)
    return row is not None and row["pid"] == w.pid and row["stopped_at"] is None
