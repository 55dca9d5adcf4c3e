"""Database errors are classified by SQLSTATE class, not an allow-list
(issue 10, item 5, API half): every error of an infrastructure class (08,
40, 53, 57, 58, 25006, 55P03; app/dberrors.py) raised under a route answers
503 DATABASE_UNAVAILABLE with Retry-After, never 500; any other database
error stays a 500 so bugs stay visible.

The errors are real Postgres errors: a trigger that RAISEs with a given
SQLSTATE under a route's statement, a read-only database, lock_timeout
behind a lock another connection holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import asyncpg
import pytest

from app.store import ExecutionStore
from app.ui.routes import CSRF_COOKIE, _csrf_of
from tests.http.conftest import api_settings
from tests.support.responses import JSON, assert_error


def _db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def _raise_on_event_insert(pool: asyncpg.Pool, sqlstate: str) -> None:
    """Every statement that appends to the history (every write route) now
    fails inside Postgres with `sqlstate`."""
    await pool.execute(f"""
        CREATE FUNCTION test_raise() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'injected by the test' USING ERRCODE = '{sqlstate}';
        END $$;
        CREATE TRIGGER test_raise BEFORE INSERT ON execution_events
            FOR EACH ROW EXECUTE FUNCTION test_raise();
    """)


INFRASTRUCTURE_CODES = [
    "08000", "08006",            # connection exception
    "40001", "40P01", "40003",   # transaction rollback (the first two retried first)
    "53100", "53200", "53300",   # disk full, out of memory, too many connections
    "57014", "57P01", "57P03",   # query canceled, admin shutdown, cannot connect now
    "58000", "58030",            # system error, I/O error
    "25006",                     # read-only SQL transaction
    "55P03",                     # lock not available
    "53999", "08999", "57999",   # codes asyncpg does not know, in those classes
]

WRITE_ROUTES = [
    ("POST", "/v1/executions", {"json": {"workflowId": "wf", "executionId": "new-1"}}),
    ("POST", "/v1/executions/e1/wakes", {}),
    ("POST", "/v1/executions/e1/signals/go", {"content": b"{}", "headers": JSON}),
    ("POST", "/v1/executions/e1/cancel", {}),
]


@pytest.mark.parametrize("sqlstate", INFRASTRUCTURE_CODES)
async def test_an_infrastructure_error_under_a_route_is_503_with_retry_after(
        sqlstate, settings, store, pool, make_client):
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    client = await make_client(api_settings(settings), raise_app_exceptions=False)
    await _raise_on_event_insert(pool, sqlstate)
    for method, path, kw in WRITE_ROUTES:
        r = await client.request(method, path, **kw)
        error = assert_error(r, 503, "DATABASE_UNAVAILABLE")
        assert int(r.headers["retry-after"]) > 0, (sqlstate, path)
        assert "retry" in error["message"]
    # The dashboard's cancel and wake buttons run the same store calls: a 503 page.
    seed = "s" * 40
    client.cookies.set(CSRF_COOKIE, seed)
    for action in ("cancel", "wake"):
        r = await client.post(f"/ui/executions/e1/{action}", data={"csrf": _csrf_of(seed)})
        assert r.status_code == 503, (action, r.status_code, r.text[:300])
        assert int(r.headers["retry-after"]) > 0
        assert "DATABASE_UNAVAILABLE" in r.text
    # Nothing was written by any of them.
    assert await pool.fetchval("SELECT count(*) FROM signals") == 0
    assert await pool.fetchval("SELECT count(*) FROM executions") == 1


@pytest.mark.parametrize("sqlstate", ["P0001", "22012", "42703"])
async def test_any_other_database_error_stays_a_500(sqlstate, settings, store, pool,
                                                    make_client):
    """A bug (a statement the code got wrong) is not disguised as an outage."""
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    client = await make_client(api_settings(settings), raise_app_exceptions=False)
    await _raise_on_event_insert(pool, sqlstate)
    r = await client.post("/v1/executions/e1/wakes")
    assert r.status_code == 500, (r.status_code, r.text)


async def test_a_read_only_database_is_503_for_writes_and_reads_still_answer(
        settings, store, pool, pg_admin, database_url, make_client):
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    name = _db_name(database_url)
    await pg_admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        client = await make_client(api_settings(settings), raise_app_exceptions=False)
        for method, path, kw in WRITE_ROUTES:
            r = await client.request(method, path, **kw)
            assert_error(r, 503, "DATABASE_UNAVAILABLE")
            assert int(r.headers["retry-after"]) > 0
        assert (await client.get("/v1/executions/e1")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
    finally:
        await pg_admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


async def test_lock_not_available_is_503_for_reads_writes_readiness_and_the_dashboard(
        settings, store, pool, pg_admin, database_url, make_client):
    """lock_timeout (55P03) behind an ACCESS EXCLUSIVE lock another session holds."""
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="e1")
    name = _db_name(database_url)
    await pg_admin.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'")
    holder = await asyncpg.connect(database_url)
    try:
        client = await make_client(api_settings(settings), raise_app_exceptions=False)
        await holder.execute("SET lock_timeout = 0")
        tx = holder.transaction()
        await tx.start()
        await holder.execute("LOCK TABLE executions, alembic_version IN ACCESS EXCLUSIVE MODE")
        for method, path, kw in [("GET", "/v1/executions/e1", {}),
                                 ("GET", "/v1/executions", {}), *WRITE_ROUTES,
                                 ("GET", "/readyz", {})]:
            r = await client.request(method, path, **kw)
            assert_error(r, 503, "DATABASE_UNAVAILABLE")
            assert int(r.headers["retry-after"]) > 0
        r = await client.get("/ui/executions/e1")
        assert r.status_code == 503, r.status_code
        assert r.headers["retry-after"]
        assert "DATABASE_UNAVAILABLE" in r.text
        await tx.rollback()
        assert (await client.get("/v1/executions/e1")).status_code == 200
    finally:
        with contextlib.suppress(Exception):
            await holder.close()
        await pg_admin.execute(f'ALTER DATABASE "{name}" RESET lock_timeout')


async def test_readyz_on_a_database_never_migrated_says_schema_out_of_date(
        settings, pool, make_client):
    client = await make_client(api_settings(settings), raise_app_exceptions=False)
    await pool.execute("DROP TABLE alembic_version")
    r = await client.get("/readyz")
    assert_error(r, 503, "SCHEMA_OUT_OF_DATE")


_ = (asyncio, ExecutionStore)
