"""Real `fencepost worker` processes for the operator tests.

    w = await procs.start("A", concurrency=4)   # returns once A is registered
    w.send(signal.SIGKILL); await w.wait_exit(5)

Each worker runs `python -m app.cli worker --workflows tests.operator.flows`
with the repository root on PYTHONPATH, DATABASE_URL of the test's database and
short FENCEPOST_* timings (lease 1 s, renew 0.2 s, poll 0.2 s, redelivery
0.05 s .. 0.2 s; overridable per worker). stdout+stderr go to `<logs>/<name>.log`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from tests.support.processes import WorkerProcess, is_registered, spawn_worker
from tests.support.waiting import wait_until

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


Proc = WorkerProcess


class Procs:
    def __init__(self, database_url: str, log_dir: Path, pool: asyncpg.Pool):
        self.database_url = database_url
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pool = pool
        self.all: list[Proc] = []

    def spawn(self, name: str, *, concurrency: int = 8,
              settings: dict[str, Any] | None = None, args: tuple[str, ...] = ()) -> Proc:
        p = spawn_worker(name, database_url=self.database_url, flows_module=FLOWS_MODULE,
                         log_dir=self.log_dir, worker_id=f"op-worker-{name}",
                         concurrency=concurrency, settings={**SETTINGS, **(settings or {})},
                         args=args)
        self.all.append(p)
        return p

    async def start(self, name: str, *, concurrency: int = 8,
                    settings: dict[str, Any] | None = None, args: tuple[str, ...] = ()) -> Proc:
        """Spawn a worker and return once it has registered (pid matches)."""
        p = self.spawn(name, concurrency=concurrency, settings=settings, args=args)

        await wait_until(lambda: is_registered(self.pool, p), timeout=20, what=f"worker {name} registered")
        return p

    def kill_all(self) -> None:
        for p in self.all:
            p.kill()

    def logs(self) -> str:
        return "\n".join(
            f"===== worker {p.name} (pid {p.pid}, exit {p.proc.poll()}) =====\n{p.log()}"
            for p in self.all)
