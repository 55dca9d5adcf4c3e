"""What both peer scripts measure the same way `fencepost bench` does:
commits per execution (the database's transaction counter over the run) and
CPU seconds per execution of the peer's processes and of the Postgres server
(process trees read from /proc before and after the run). Needs psycopg only,
which both peers' venvs have."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Fields counted from after the command name's closing parenthesis.
    return raw[raw.rindex(")") + 2:].split()


def trees_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system, own and of waited-for children) of `pids`
    and of their live descendants."""
    table: dict[int, tuple[int, float]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = (int(fields[1]),
                                      sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, list(pids)
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
            stack.extend(children.get(pid, []))
    return total


def _named_postgres(pid: int) -> bool:
    try:
        return (PROC / str(pid) / "comm").read_text().strip().startswith(("postgres", "postmaster"))
    except OSError:
        return False


class Meter:
    """Commits and CPU seconds over one measured run, per execution."""

    def __init__(self, url: str, pids: list[int]) -> None:
        self.url = url
        self.pids = pids
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            # Read while the connection is open: its backend exits with it.
            backend = _stat(int(row[0])) if _named_postgres(int(row[0])) else None
        parent = int(backend[1]) if backend is not None else None
        # None when the server is not on this machine (or not visible in /proc).
        self.postmaster = parent if parent is not None and _named_postgres(parent) else None
        self._before: tuple[int, float, float] = (0, 0.0, 0.0)

    def _commits(self) -> int:
        time.sleep(1.2)  # backends flush their statistics about once a second
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                               "WHERE datname = current_database()").fetchone()
        assert row is not None
        return int(row[0])

    def _cpu(self) -> tuple[float, float]:
        postgres = trees_seconds([self.postmaster]) if self.postmaster is not None else 0.0
        return trees_seconds(self.pids), postgres

    def start(self) -> None:
        commits = self._commits()
        self._before = (commits, *self._cpu())

    def per_execution(self, executions: int) -> dict[str, float | None]:
        # CPU first: the wait for the statistics below is not the run's.
        cpu, postgres = self._cpu()
        commits = self._commits()
        return {
            "commits_per_execution": round((commits - self._before[0]) / executions, 2),
            "peer_cpu_s_per_execution": round((cpu - self._before[1]) / executions, 6),
            "postgres_cpu_s_per_execution": (
                round((postgres - self._before[2]) / executions, 6)
                if self.postmaster is not None else None),
        }


def load_average() -> float:
    return round(os.getloadavg()[0], 2)
