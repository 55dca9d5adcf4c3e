"""CPU seconds spent by the bench's processes, read from /proc.

A process tree's CPU is its own user+system time, the time of its children
that exited and were waited for (cutime+cstime), and the same of each live
child. Read before and after a measured run, the difference is what the tree
spent meanwhile, whichever of its processes came and went."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: the
    # fields are counted from after its closing one.
    return raw[raw.rindex(")") + 2:].split()


def _table() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU seconds of its own and of its waited-for children)}
    for every process /proc shows, read in one pass."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                # After the name: state ppid ... utime stime cutime cstime
                # (0-based 11..14).
                seconds = sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS
                table[int(entry.name)] = (int(fields[1]), seconds)
    return table


def trees_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of `pids` and their live descendants, exited ones included
    (a process that is gone counts 0.0)."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total = 0.0
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
            stack.extend(children.get(pid, []))
    return total


def postmaster_of(backend_pid: int, host: str | None) -> tuple[int | None, str | None]:
    """(postmaster pid, None) when the server whose backend is `backend_pid`
    runs on this machine and /proc shows it; else (None, the reason)."""
    if host and not host.startswith("/") and host not in ("localhost", "127.0.0.1", "::1"):
        return None, f"Postgres runs on {host}, not on this machine: its processes are not in /proc"
    fields = _stat(backend_pid)
    if fields is None or not _named_postgres(backend_pid):
        return None, ("the server's backend is not in this machine's /proc "
                      "(another host, or a container's own process IDs)")
    parent = int(fields[1])
    if not _named_postgres(parent):
        return None, "the backend's parent process is not the postmaster in this machine's /proc"
    return parent, None


def _named_postgres(pid: int) -> bool:
    try:
        name = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return False
    return name.startswith(("postgres", "postmaster"))


class CpuMeter:
    """CPU seconds per execution of the API, the workers and Postgres, each
    side a set of process trees read before and after a measured run.
    Postgres is None (with `postgres_reason`) when its server is not local."""

    def __init__(self, api: list[int], workers: list[int], postmaster: int | None,
                 postgres_reason: str | None) -> None:
        self.sides = {"api": api, "worker": workers}
        self.postmaster = postmaster
        self.postgres_reason = postgres_reason
        self._before: dict[str, float] = {}

    @classmethod
    def for_run(cls, conn: asyncpg.Connection, url: str,
                pids: Callable[[], tuple[list[int], list[int]]]) -> CpuMeter:
        """The meter of the API and worker processes `pids()` names and of the
        server `conn` is connected to (by `url`)."""
        postmaster, reason = postmaster_of(conn.get_server_pid(), database_host(url))
        api, workers = pids()
        return cls(api, workers, postmaster, reason)

    def _read(self) -> dict[str, float]:
        seconds = {side: trees_seconds(pids) for side, pids in self.sides.items()}
        if self.postmaster is not None:
            seconds["postgres"] = trees_seconds([self.postmaster])
        return seconds

    def start(self) -> None:
        self._before = self._read()

    def per_execution(self, executions: int) -> dict[str, float | str | None]:
        after = self._read()
        fields: dict[str, float | str | None] = {
            f"{side}_cpu_s_per_execution": (after[side] - self._before[side]) / executions
            for side in self.sides
        }
        if self.postmaster is None:
            fields["postgres_cpu_s_per_execution"] = None
            fields["postgres_cpu_null_reason"] = self.postgres_reason
        else:
            fields["postgres_cpu_s_per_execution"] = (
                after["postgres"] - self._before["postgres"]) / executions
        return fields


def database_host(url: str) -> str | None:
    """The host a connection URL names (a socket directory, a name, or None:
    the default socket)."""
    parts = urlsplit(url)
    hosts = parse_qs(parts.query).get("host")
    return parts.hostname or (hosts[0] if hosts else None)
