"""The soak's children: the API and the worker processes it starts, kills,
pauses and stops, with the short lease settings that make a killed worker's
deliveries be taken over within the run."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import asyncpg

# Short leases so that a killed worker's deliveries are taken over within the run.
CHILD_SETTINGS: dict[str, str] = {
    "FENCEPOST_LEASE_SECONDS": "2",
    "FENCEPOST_RENEW_SECONDS": "0.5",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_REDELIVERY_BASE_SECONDS": "0.1",
    "FENCEPOST_REDELIVERY_CAP_SECONDS": "1",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "3",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "5",
}



def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    worker_id: str | None
    proc: subprocess.Popen
    log: TextIO = field(repr=False)
    killed: bool = False  # by the soak, on purpose
    paused: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None


class Processes:
    """The API and the workers: spawned from the main thread (the parent-death
    signal follows the thread that forked), each in its own session, logs in
    `log_dir`."""

    def __init__(self, url: str, port: int, concurrency: int, log_dir: Path):
        self.port = port
        self.concurrency = concurrency
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            **CHILD_SETTINGS,
            "DATABASE_URL": url,
            "FENCEPOST_WORKFLOWS": "app.tools.soakflows",
            # Loopback children of this process only, as for dev and bench.
            "FENCEPOST_AUTH": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
        self.api: Child | None = None
        self.workers: list[Child] = []  # live ones, oldest first
        self.gone: list[Child] = []  # killed or exited
        self._n = 0
        self._tag = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"

    def _spawn(self, name: str, argv: list[str], worker_id: str | None) -> Child:
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *argv], env=self.env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        return Child(name, worker_id, proc, log)

    def start_api(self) -> Child:
        self.api = self._spawn("api", ["api", "--host", "127.0.0.1", "--port", str(self.port),
                                       "--log-level", "warning"], None)
        return self.api

    def start_worker(self) -> Child:
        self._n += 1
        worker_id = f"soak-{self._tag}-w{self._n}"
        child = self._spawn(f"worker-{self._n}", [
            "worker", "--concurrency", str(self.concurrency), "--worker-id", worker_id,
            "--log-level", "info",
        ], worker_id)
        self.workers.append(child)
        return child

    def kill(self, child: Child) -> None:
        child.killed = True
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGCONT)  # a stopped process dies only once continued
            child.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=10)
        self._retire(child)

    def _retire(self, child: Child) -> None:
        if child in self.workers:
            self.workers.remove(child)
            self.gone.append(child)

    def reap_exited(self) -> list[Child]:
        """Workers that exited on their own (not killed by the soak)."""
        exited = [c for c in self.workers if not c.alive()]
        for c in exited:
            self._retire(c)
        return exited

    def stop(self, grace: float = 15.0) -> None:
        children = [*self.workers, *([self.api] if self.api else [])]
        for c in children:
            if c.alive():
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGCONT)
                    c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        for c in [*children, *self.gone]:
            with contextlib.suppress(Exception):
                c.log.close()




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_tempdir(prefix: str) -> Path:
    """On tmpfs when it has room (the server is throw-away, durability off)."""
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 1 << 30:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=shm))
    base = tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base if len(base) <= 40 else "/tmp"))


async def wait_ready(procs: Processes, conn: asyncpg.Connection, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    api = procs.api
    if api is None:
        raise RuntimeError("wait_ready needs the API started (start_api) first")
    while True:
        if not api.alive():
            raise RuntimeError(f"the API exited with {api.proc.returncode}")
        if procs.reap_exited():
            raise RuntimeError("a worker exited before the soak began")
        api_ready = False
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            api_ready = await asyncio.wait_for(http_get(procs.port, "/readyz"), 2) == 200
        if api_ready:
            ids = [w.worker_id for w in procs.workers]
            registered = await conn.fetchval(
                "SELECT count(*) FROM workers WHERE worker_id = ANY($1::text[]) "
                "AND stopped_at IS NULL", ids)
            if registered == len(ids):
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the API or the workers did not become ready in time")
        await asyncio.sleep(0.1)


async def http_get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        status = await reader.readline()
        return int(status.split()[1])
    finally:
        writer.close()


def log_tail(path: Path, n: int) -> list[str]:
    """The last `n` warning or error lines of a child's log (JSON lines)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines
            if '"level": "warning"' in line or '"level": "error"' in line][-n:]
