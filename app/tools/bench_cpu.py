"""CPU seconds spent by the bench's processes, read from /proc.

A process tree's CPU is its own user+system time, the time of its children
that exited and were waited for (cutime+cstime), and the same of each live
child. Read before and after a measured run, the difference is what the tree
spent meanwhile, whichever of its processes came and went."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import asyncpg

from app.db import asyncpg_dsn

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
    Postgres is every server of the database (one, or each node of a Citus
    cluster), summed; None (with `postgres_reason`) when any of them is not
    local: a part of the servers' CPU would read as all of it."""

    def __init__(self, api: list[int], workers: list[int], postmasters: list[int] | None,
                 postgres_reason: str | None) -> None:
        self.sides = {"api": api, "worker": workers}
        self.postmasters = postmasters
        self.postgres_reason = postgres_reason
        self._before: dict[str, float] = {}

    @classmethod
    async def for_run(cls, conn: asyncpg.Connection, url: str,
                      pids: Callable[[], tuple[list[int], list[int]]]) -> CpuMeter:
        """The meter of the API and worker processes `pids()` names and of the
        servers of the database `conn` is connected to (by `url`)."""
        postmasters, reason = await servers_of(conn, url)
        api, workers = pids()
        return cls(api, workers, postmasters, reason)

    def _read(self) -> dict[str, float]:
        seconds = {side: trees_seconds(pids) for side, pids in self.sides.items()}
        if self.postmasters is not None:
            seconds["postgres"] = trees_seconds(self.postmasters)
        return seconds

    def start(self) -> None:
        self._before = self._read()

    def per_execution(self, executions: int) -> dict[str, float | int | str | None]:
        after = self._read()
        fields: dict[str, float | int | str | None] = {
            f"{side}_cpu_s_per_execution": (after[side] - self._before[side]) / executions
            for side in self.sides
        }
        if self.postmasters is None:
            fields["postgres_cpu_s_per_execution"] = None
            fields["postgres_cpu_null_reason"] = self.postgres_reason
        else:
            fields["postgres_cpu_s_per_execution"] = (
                after["postgres"] - self._before["postgres"]) / executions
            fields["postgres_cpu_servers"] = len(self.postmasters)
        return fields


async def servers_of(conn: asyncpg.Connection, url: str) -> tuple[list[int] | None, str | None]:
    """(the postmaster of each server holding the database `conn` is
    connected to by `url`, None) or (None, why not all of them are local).
    One server; on a Citus coordinator also each worker node in its
    pg_dist_node, reached at the same database by a connection of its own."""
    postmaster, reason = postmaster_of(conn.get_server_pid(), database_host(url))
    if postmaster is None:
        return None, reason
    postmasters = [postmaster]
    if not await conn.fetchval("SELECT true FROM pg_extension WHERE extname = 'citus'"):
        return postmasters, None
    nodes = await conn.fetch(
        "SELECT nodename, nodeport FROM pg_dist_node "
        "WHERE groupid <> 0 AND noderole = 'primary' AND isactive ORDER BY groupid")
    for node in nodes:
        where = f"{node['nodename']}:{node['nodeport']}"
        try:
            other = await asyncpg.connect(url_at(asyncpg_dsn(url), node["nodename"], node["nodeport"]))
        except (OSError, asyncpg.PostgresError) as exc:
            return None, f"Citus worker node {where} not reachable from the bench: {exc}"
        try:
            backend = other.get_server_pid()
            found, reason = postmaster_of(backend, node["nodename"])
        finally:
            await other.close()
        if found is None:
            return None, f"Citus worker node {where}: {reason}"
        # Two node entries for one server would count its CPU twice.
        if found not in postmasters:
            postmasters.append(found)
    return postmasters, None


def url_at(url: str, host: str, port: int) -> str:
    """`url` (its user, password, database, options) on the server at host:port."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    query = urlencode([(k, v) for k, values in parse_qs(parts.query).items()
                       if k not in ("host", "port") for v in values])
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{hostport}" if userinfo else hostport,
                                     query=query))


def database_host(url: str) -> str | None:
    """The host a connection URL names (a socket directory, a name, or None:
    the default socket)."""
    parts = urlsplit(url)
    hosts = parse_qs(parts.query).get("host")
    return parts.hostname or (hosts[0] if hosts else None)
