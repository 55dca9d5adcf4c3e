"""Issue 19 item 6: settings every process must share (poison threshold, lease,
redelivery) are stored once in the database by the first api or worker; a
process started with another value refuses to start (exit 2) naming the
setting, both values and `fencepost settings set`; the dashboard shows the
stored (applied) value."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.settings import Settings
from app.shared_settings import SHARED
from app.store import ExecutionStore
from tests.operator.procs import SETTINGS as SHORT
from tests.support.api_process import api_env, run_api_cli
from tests.support.processes import REPO_ROOT, WorkerProcess, is_registered, spawn_worker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

FLOWS = "tests.operator.flows"


class Workers:
    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.database_url, self.log_dir, self.all = database_url, log_dir, []

    def spawn(self, name: str, **settings) -> WorkerProcess:
        p = spawn_worker(name, database_url=self.database_url, flows_module=FLOWS,
                         log_dir=self.log_dir, worker_id=f"shared-{name}", concurrency=2,
                         settings={**SHORT, **{k: str(v) for k, v in settings.items()}})
        self.all.append(p)
        return p

    async def started(self, pool: asyncpg.Pool, name: str, **settings) -> WorkerProcess:
        p = self.spawn(name, **settings)
        await wait_until(lambda: is_registered(pool, p), timeout=30, detail=p.log,
                         what=f"worker {name} registered")
        return p


@pytest_asyncio.fixture
async def workers(database_url: str, tmp_path) -> AsyncIterator[Workers]:
    w = Workers(database_url, tmp_path)
    try:
        yield w
    finally:
        for p in w.all:
            p.kill()


def cli(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=REPO_ROOT,
                          env=api_env(database_url, env), capture_output=True, text=True,
                          timeout=60)


async def stored(pool: asyncpg.Pool) -> dict:
    return {r["name"]: r["value"] for r in await pool.fetch(
        "SELECT name, value FROM shared_settings")}


async def test_a_worker_with_another_poison_threshold_refuses_to_start(
        workers: Workers, pool: asyncpg.Pool) -> None:
    assert await stored(pool) == {}  # migrate stores nothing: the first process does
    first = await workers.started(pool, "first", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=3)
    assert (await stored(pool))["max_unacknowledged_deliveries"] == 3

    other = workers.spawn("other", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=25)
    assert await other.wait_exit(30) == 2, other.log()
    log = other.log()
    for text in ("FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES", "is 25 in this process",
                 "but 3 in the database",
                 "fencepost settings set FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES 25"):
        assert text in log, log
    assert await pool.fetchval("SELECT count(*) FROM workers WHERE worker_id = 'shared-other'"
                               ) == 0, "a refused worker never registers"
    assert (await stored(pool))["max_unacknowledged_deliveries"] == 3
    # The same value starts; the first one kept running throughout.
    await workers.started(pool, "same", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=3)
    assert first.alive()


async def test_every_shared_setting_is_checked(workers: Workers, pool: asyncpg.Pool) -> None:
    await workers.started(pool, "first")
    base = {field: float(v) for field, v in (await stored(pool)).items()}
    assert set(base) == set(SHARED), base
    different = {"FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES": 7, "FENCEPOST_LEASE_SECONDS": 2,
                 "FENCEPOST_REDELIVERY_BASE_SECONDS": 0.1, "FENCEPOST_REDELIVERY_CAP_SECONDS": 0.3}
    assert set(different) == set(SHARED.values())
    procs = {env: workers.spawn(f"x{i}", **{env: value})
             for i, (env, value) in enumerate(different.items())}
    for env, p in procs.items():
        assert await p.wait_exit(30) == 2, (env, p.log())
        problems = [line for line in p.log().splitlines() if "in this process but" in line]
        assert len(problems) == 1 and env in problems[0], (env, p.log())


async def test_an_api_process_refuses_too(workers: Workers, database_url: str,
                                          pool: asyncpg.Pool) -> None:
    await workers.started(pool, "first", FENCEPOST_LEASE_SECONDS=1)
    r = await asyncio.to_thread(run_api_cli, database_url, "--port", "1",
                                env={"FENCEPOST_AUTH": "disabled", "FENCEPOST_LEASE_SECONDS": "5"})
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "FENCEPOST_LEASE_SECONDS is 5 in this process but 1 in the database" in r.stderr, (
        r.stderr)


async def test_settings_set_changes_it_deliberately(
        workers: Workers, database_url: str, pool: asyncpg.Pool) -> None:
    await workers.started(pool, "old", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=3)
    shown = await asyncio.to_thread(cli, database_url, "settings", "show",
                                    FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES="9")
    assert shown.returncode == 0, shown.stderr
    assert "FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES = 3 (stored" in shown.stdout, shown.stdout
    assert "this environment: 9" in shown.stdout, shown.stdout

    for bad in (("FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES", "2.5"),
                ("FENCEPOST_LEASE_SECONDS", "0"), ("FENCEPOST_LEASE_SECONDS", "nan"),
                ("FENCEPOST_REDELIVERY_CAP_SECONDS", "0.01")):  # below the stored base
        r = await asyncio.to_thread(cli, database_url, "settings", "set", *bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
    assert (await stored(pool))["max_unacknowledged_deliveries"] == 3

    r = await asyncio.to_thread(cli, database_url, "settings", "set",
                                "FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES", "9")
    assert r.returncode == 0, r.stderr
    assert "was 3" in r.stdout and "restart every api and worker" in r.stdout, r.stdout
    assert (await stored(pool))["max_unacknowledged_deliveries"] == 9
    await workers.started(pool, "new", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=9)
    late = workers.spawn("late", FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES=3)
    assert await late.wait_exit(30) == 2, late.log()


async def test_the_first_writer_wins_when_two_start_at_once(pool: asyncpg.Pool) -> None:
    """Forced interleaving: another process has inserted its value and not
    committed when this one stores; this one waits, stores nothing, and
    answers the committed value (seen by its second statement)."""
    store = ExecutionStore(pool)
    other = await pool.acquire()
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("INSERT INTO shared_settings (name, value) "
                            "VALUES ('lease_seconds', '7'::jsonb)")
        mine = asyncio.create_task(store.settings.store_shared_settings(
            {"lease_seconds": 1.0, "max_unacknowledged_deliveries": 4}))

        async def waiting() -> bool:
            return bool(await pool.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"))
        await wait_until(waiting, timeout=5, interval=0.01,
                         what="the second store waiting on the first's row")
        assert not mine.done()
        await tx.commit()
        answer = await asyncio.wait_for(mine, 10)
    finally:
        await pool.release(other)
    assert {k: v.value for k, v in answer.items()} == {
        "lease_seconds": 7, "max_unacknowledged_deliveries": 4}, answer
    assert await stored(pool) == {"lease_seconds": 7, "max_unacknowledged_deliveries": 4}


async def test_the_dashboard_shows_the_stored_threshold(
        database_url: str, pool: asyncpg.Pool) -> None:
    store = ExecutionStore(pool)
    await store.admissions.admit(workflow_id="op-quick", params={}, execution_id="dash-1")
    settings = Settings(auth="disabled", database_url=database_url, workflows="",
                        max_unacknowledged_deliveries=25)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            page = (await c.get("/ui/executions/dash-1")).text
            assert "of 25 before it is parked as poison" in page  # none stored: its own
            await store.settings.store_shared_settings({"max_unacknowledged_deliveries": 3})
            page = (await c.get("/ui/executions/dash-1")).text
            assert "of 3 before it is parked as poison" in page, page[-3000:]
