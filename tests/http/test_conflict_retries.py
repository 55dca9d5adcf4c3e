"""Serialization failures and deadlocks are retried inside the store, a
bounded number of times (issue 10, item 1): a real deadlock, forced with two
connections and a lock barrier, costs the caller nothing; a conflict that
persists answers 503 with Retry-After, never 500.

The barrier: a trigger on execution_events takes advisory lock 4242, which a
second session ("the other transaction") holds. The store's statement locks
the execution row, then waits at the trigger; the other transaction then
updates the same row: a lock cycle. The store's session has the short
deadlock_timeout, so it is the one Postgres aborts (40P01); the other
transaction then gets the row and commits, and the store's retry succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

import asyncpg
import pytest

from app.db import create_pool
from app.store import ExecutionStore
from app.store.retry import DEFAULT_ATTEMPTS
from tests.http.conftest import api_settings
from tests.support.responses import assert_error
from tests.support.waiting import wait_until

BARRIER = """
CREATE FUNCTION test_barrier() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('test_barrier_passes');
    PERFORM pg_advisory_xact_lock(4242);
    RETURN NEW;
END $$;
CREATE SEQUENCE test_barrier_passes;
CREATE TRIGGER test_barrier BEFORE INSERT ON execution_events
    FOR EACH ROW EXECUTE FUNCTION test_barrier();
"""


def _db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@contextlib.asynccontextmanager
async def short_deadlock_timeout(pg_admin, database_url):
    """Sessions opened on the test database from now on detect a deadlock
    after 100 ms (the other transaction sets its own to 30 s)."""
    name = _db_name(database_url)
    await pg_admin.execute(f"ALTER DATABASE \"{name}\" SET deadlock_timeout = '100ms'")
    try:
        yield
    finally:
        await pg_admin.execute(f'ALTER DATABASE "{name}" RESET deadlock_timeout')


async def deadlock_once(database_url: str, pool: asyncpg.Pool, execution_id: str, call):
    """Run `call()` (a store call or a request) into a real deadlock with another
    transaction on `execution_id`'s row; return (call's answer, deadlocks the
    other transaction survived)."""
    await pool.execute(BARRIER)
    other = await asyncpg.connect(database_url)
    try:
        await other.execute("SET deadlock_timeout = '30s'")
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT pg_advisory_xact_lock(4242)")
        task = asyncio.create_task(call())
        # The store's statement holds the row and waits at the barrier.
        await wait_until(lambda: pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
            what="the store's statement waiting at the barrier", interval=0.01)
        # Close the cycle: Postgres aborts the store's statement, this one proceeds.
        await other.execute("UPDATE executions SET updated_at = now() WHERE execution_id = $1",
                            execution_id)
        await tx.commit()
        answer = await asyncio.wait_for(task, timeout=10)
    finally:
        await other.close()
    return answer


async def test_a_deadlocked_statement_is_retried_and_the_route_answers(
        settings, pool, pg_admin, database_url, make_client):
    store = ExecutionStore.from_settings(pool, settings)
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    async with short_deadlock_timeout(pg_admin, database_url):
        client = await make_client(api_settings(settings), raise_app_exceptions=False)
        api_pool = client.app.state.store.pool
        r = await deadlock_once(database_url, pool, "e1",
                                lambda: client.post("/v1/executions/e1/wakes"))
    assert r.status_code == 200 and r.json() == {"status": "requested"}, r.text
    # One deadlock met, one retry, and the retry went through the barrier.
    assert api_pool.retried == {"40P01": 1}
    assert not api_pool.exhausted
    assert await pool.fetchval("SELECT last_value FROM test_barrier_passes") == 2
    # The aborted attempt left nothing: one wake event.
    kinds = await pool.fetch("SELECT kind FROM execution_events WHERE execution_id = 'e1' "
                             "ORDER BY event_id")
    assert [k["kind"] for k in kinds] == ["admitted", "wake_requested"]


async def test_a_deadlocked_transaction_is_run_again_as_a_whole(
        settings, pool, pg_admin, database_url):
    """request_cancel is two statements in one transaction (lock the root, then
    cancel the tree): the deadlock aborts the transaction and
    run_in_transaction runs all of it again."""
    seed = ExecutionStore.from_settings(pool, settings)
    await seed.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    async with short_deadlock_timeout(pg_admin, database_url):
        own = await create_pool(settings, min_size=1, max_size=2)
        try:
            store = ExecutionStore.from_settings(own, settings)
            answer = await deadlock_once(database_url, pool, "e1",
                                         lambda: store.operator.request_cancel("e1", "tester"))
        finally:
            await own.close()
    assert answer == ("cancelled", "cancelled")
    assert store.pool.retried == {"40P01": 1}
    assert await pool.fetchval("SELECT status FROM executions WHERE execution_id = 'e1'") \
        == "cancelled"
    kinds = await pool.fetch("SELECT kind FROM execution_events WHERE execution_id = 'e1' "
                             "ORDER BY event_id")
    assert [k["kind"] for k in kinds] == ["admitted", "cancel_requested", "cancelled"]


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
async def test_a_conflict_that_persists_is_503_after_bounded_attempts(
        sqlstate, settings, store, pool, make_client):
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    client = await make_client(api_settings(settings), raise_app_exceptions=False)
    await pool.execute(f"""
        CREATE SEQUENCE test_attempts;
        CREATE FUNCTION test_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM nextval('test_attempts');  -- not rolled back with the statement
            RAISE EXCEPTION 'conflict injected by the test' USING ERRCODE = '{sqlstate}';
        END $$;
        CREATE TRIGGER test_conflict BEFORE INSERT ON execution_events
            FOR EACH ROW EXECUTE FUNCTION test_conflict();
    """)
    started = time.perf_counter()
    r = await client.post("/v1/executions/e1/wakes")
    elapsed = time.perf_counter() - started
    error = assert_error(r, 503, "DATABASE_UNAVAILABLE")
    assert "conflicting with concurrent requests; retry after" in error["message"]
    assert int(r.headers["retry-after"]) > 0
    assert await pool.fetchval("SELECT last_value FROM test_attempts") == DEFAULT_ATTEMPTS
    api_pool = client.app.state.store.pool
    assert api_pool.retried == {sqlstate: DEFAULT_ATTEMPTS - 1}
    assert api_pool.exhausted == {sqlstate: 1}
    assert elapsed < 2.0, elapsed  # bounded: short backoffs, not a hang
    print(f"{DEFAULT_ATTEMPTS} attempts then 503 in {elapsed * 1000:.0f} ms")


async def test_other_errors_are_not_retried(settings, store, pool):
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    await pool.execute("""
        CREATE SEQUENCE test_attempts;
        CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM nextval('test_attempts');
            RAISE EXCEPTION 'out of disk' USING ERRCODE = '53100';
        END $$;
        CREATE TRIGGER test_fail BEFORE INSERT ON execution_events
            FOR EACH ROW EXECUTE FUNCTION test_fail();
    """)
    with pytest.raises(asyncpg.DiskFullError):
        await store.operator.request_wake("e1")
    assert await pool.fetchval("SELECT last_value FROM test_attempts") == 1
    assert not store.pool.retried


async def test_store_pool_is_still_a_pool(store, pool):
    """Tests and tools run raw SQL on store.pool and acquire connections from it."""
    assert await store.pool.fetchval("SELECT 41 + 1") == 42
    async with store.pool.acquire() as conn:
        assert await conn.fetchval("SELECT 1") == 1
    assert store.pool.raw is pool
    assert ExecutionStore(store.pool).pool is store.pool  # wrapped once
