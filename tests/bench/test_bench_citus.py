"""`fencepost bench --citus-url`: the real command as a subprocess, measuring
this test's plain database and a Citus database in one invocation; the test
checks the one JSON line has both sets of figures and that each run went to
its own database. (Tiny numbers: speed is never asserted.)

The Citus database is made here, on the cluster whose coordinator
TEST_CITUS_URL names (its `postgres`-like admin database, the worker nodes
registered in it, a superuser): created on every node, the citus extension
in each, the coordinator and the workers registered in the coordinator's
copy; dropped on every node after. Without TEST_CITUS_URL that test is
skipped, with the reason."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from app.tools.bench_cpu import servers_of, url_at
from tests.bench.test_bench import bench
from tests.bench.test_bench_measures import _line
from tests.conftest import with_database

CITUS_URL = os.environ.get("TEST_CITUS_URL", "").strip()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
async def citus_database_url() -> AsyncIterator[str]:
    """A fresh Citus database on TEST_CITUS_URL's cluster (not migrated)."""
    if not CITUS_URL:
        pytest.skip("needs a Citus cluster: set TEST_CITUS_URL to its coordinator's DSN "
                    "(e.g. postgresql://postgres@127.0.0.1:9700/postgres)")
    conn = await asyncpg.connect(CITUS_URL)
    try:
        nodes = await conn.fetch(
            "SELECT groupid, nodename, nodeport FROM pg_dist_node "
            "WHERE noderole = 'primary' AND isactive ORDER BY groupid")
    finally:
        await conn.close()
    workers = [(r["nodename"], r["nodeport"]) for r in nodes if r["groupid"] != 0]
    assert workers, f"TEST_CITUS_URL ({CITUS_URL}): its pg_dist_node lists no worker node"
    coordinator = next(((r["nodename"], r["nodeport"]) for r in nodes if r["groupid"] == 0),
                       None)
    if coordinator is None:  # never registered itself: the nodes reach it where the URL does
        split = urlsplit(CITUS_URL)
        coordinator = (split.hostname or "127.0.0.1", split.port or 5432)
    # Each node's admin database: the coordinator's as given, each worker's of
    # the same name on that node.
    admins = [CITUS_URL] + [url_at(CITUS_URL, host, port) for host, port in workers]
    name = f"bench_citus_{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    try:
        for admin in admins:
            await _execute(admin, f"CREATE DATABASE {_quote(name)}")
            made.append(admin)
            await _execute(with_database(admin, name), "CREATE EXTENSION citus")
        url = with_database(CITUS_URL, name)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("SELECT citus_set_coordinator_host($1, $2)", *coordinator)
            for host, port in workers:
                await conn.execute("SELECT citus_add_node($1, $2)", host, port)
        finally:
            await conn.close()
        yield url
    finally:
        # The coordinator first: its maintenance daemon holds connections to
        # the workers' copies; FORCE ends any still open.
        for admin in made:
            await _execute(admin, f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")


async def _fetchrow(url: str, query: str) -> asyncpg.Record:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(query)
        assert row is not None
        return row
    finally:
        await conn.close()


# The first admission of each database's runs and whether it is on Citus:
# the order of the two runs is read back from what each database holds (both
# servers on this machine's clock).
# (The aggregates apart from the EXISTS: Citus pushes no subquery of a target
# list down past an aggregate.)
_FIRST_ADMISSION = (
    "SELECT a.*, x.citus FROM (SELECT min(admitted_at) AS first, "
    "count(*) FILTER (WHERE execution_id LIKE '%-mixed-%' AND status = 'completed') AS mixed, "
    "count(*) FILTER (WHERE execution_id LIKE '%-backlog-%' AND status = 'completed') "
    "AS backlog FROM executions) a, "
    "(SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS citus) x")


@pytest.mark.acceptance
@pytest.mark.timeout(420)
@pytest.mark.parametrize("citus_first", [True], ids=["citus-first"])
async def test_bench_citus_url_prints_plain_and_citus_figures(
        database_url: str, citus_database_url: str, citus_first: bool) -> None:
    flags = ["--citus-first"] if citus_first else []
    proc = await asyncio.to_thread(
        bench, database_url, "--citus-url", citus_database_url, *flags, "--executions", "20",
        "--latency-samples", "3", "--quota-executions", "16", "--clients", "4",
        "--workers", "2", "--concurrency", "8", timeout=400)
    line = _line(proc)

    # The plain figures, as without --citus-url.
    for key in ("executions_per_second", "backlog_executions_per_second",
                "admissions_per_second", "start_latency_p50_ms", "commits_per_execution",
                "quota_admission_ratio"):
        assert line[key] > 0, (key, line)
    # The same figures on Citus, and the two added.
    for key in ("executions_per_second", "backlog_executions_per_second",
                "admissions_per_second", "start_latency_p50_ms", "commits_per_execution",
                "quota_admission_ratio"):
        assert line[f"citus_{key}"] > 0, (key, line)
    assert line["citus_ratio"] == pytest.approx(
        line["citus_executions_per_second"] / line["executions_per_second"], rel=0.02), line
    conn = await asyncpg.connect(citus_database_url)
    try:
        workers = await conn.fetchval(
            "SELECT count(*) FROM pg_dist_node "
            "WHERE groupid <> 0 AND noderole = 'primary' AND isactive")
    finally:
        await conn.close()
    assert line["citus_nodes"] == workers, line
    assert line["citus_first"] is citus_first, line
    # Postgres CPU: one server for the plain run; the coordinator and every
    # worker summed on Citus (null, with the reason, only when one is remote).
    for prefix, servers in (("", 1), ("citus_", workers + 1)):
        if line[f"{prefix}postgres_cpu_s_per_execution"] is None:
            assert line[f"{prefix}postgres_cpu_null_reason"], line
        else:
            assert line[f"{prefix}postgres_cpu_s_per_execution"] > 0, line
            assert line[f"{prefix}postgres_cpu_servers"] == servers, line

    # Each run went to its own database: the plain one has no citus, the
    # Citus one was distributed, and each completed its own executions.
    plain = await _fetchrow(database_url, _FIRST_ADMISSION)
    citus = await _fetchrow(citus_database_url, _FIRST_ADMISSION)
    assert (plain["citus"], plain["mixed"], plain["backlog"]) == (False, 20, 20), dict(plain)
    assert (citus["citus"], citus["mixed"], citus["backlog"]) == (True, 20, 20), dict(citus)
    distributed = await _fetchrow(
        citus_database_url,
        "SELECT partmethod::text AS method FROM pg_dist_partition "
        "WHERE logicalrelid = 'executions'::regclass")
    assert distributed["method"] == "h", dict(distributed)
    # In the order asked for.
    assert (citus["first"] < plain["first"]) is citus_first, (dict(plain), dict(citus))


async def _postmaster_pid(url: str) -> int | None:
    """The postmaster of the server at `url` as its data directory's
    postmaster.pid says; None when that directory is not on this machine."""
    conn = await asyncpg.connect(url)
    try:
        directory = await conn.fetchval("SHOW data_directory")
    finally:
        await conn.close()
    try:
        with open(os.path.join(directory, "postmaster.pid")) as f:
            return int(f.readline())
    except OSError:
        return None


async def test_postgres_cpu_on_citus_covers_the_coordinator_and_every_worker(
        citus_database_url: str, database_url: str) -> None:
    conn = await asyncpg.connect(citus_database_url)
    try:
        nodes = await conn.fetch(
            "SELECT nodename, nodeport FROM pg_dist_node "
            "WHERE groupid <> 0 AND noderole = 'primary' AND isactive ORDER BY groupid")
        postmasters, reason = await servers_of(conn, citus_database_url)
    finally:
        await conn.close()
    expected = [await _postmaster_pid(citus_database_url)] + [
        await _postmaster_pid(url_at(citus_database_url, n["nodename"], n["nodeport"]))
        for n in nodes]
    if None in expected:  # a node not on this machine: no figure, and why
        assert postmasters is None and reason, (postmasters, reason)
    else:
        assert (postmasters, reason) == (expected, None)
        assert len(set(expected)) == len(nodes) + 1
    # A plain database: its one server.
    conn = await asyncpg.connect(database_url)
    try:
        plain = await servers_of(conn, database_url)
    finally:
        await conn.close()
    own = await _postmaster_pid(database_url)
    if own is None:  # e.g. the test bed's Postgres in a container: no figure, and why
        assert plain[0] is None and plain[1], plain
    else:
        assert plain == ([own], None)


@pytest.mark.parametrize("flags", [("--history", "5"), ("--timers", "2"), ("--queues",)])
def test_bench_citus_url_refuses_the_other_modes(flags):
    # Refused before any database is reached: the URL names no server.
    proc = bench(None, "--citus-url", "postgresql://postgres@127.0.0.1:1/none", *flags,
                 timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--citus-url" in proc.stdout and flags[0] in proc.stdout, proc.stdout


def test_bench_citus_first_needs_citus_url():
    proc = bench(None, "--citus-first", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--citus-url" in proc.stdout, proc.stdout
