"""A database outage is 503 DATABASE_UNAVAILABLE with Retry-After, within a
bounded time, never a 500; the API recovers when the database comes back.

Uses a private embedded Postgres (`embedded_server`) that the test stops and
starts, and the per-test database that the test drops from under the app."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import asyncpg

from app.migrate import upgrade
from app.settings import Settings
from tests.http.conftest import api_settings
from tests.support.responses import JSON, assert_error
from tests.support.waiting import wait_until

OUTAGE_BOUND_SECONDS = 10.0

REQUESTS = [
    ("GET", "/v1/executions/e1", {}),
    ("GET", "/v1/executions", {}),
    ("POST", "/v1/executions", {"json": {"workflowId": "wf", "executionId": "during"}}),
    ("POST", "/v1/executions/e1/wakes", {}),
    ("POST", "/v1/executions/e1/signals/go", {"content": b"{}", "headers": JSON}),
]


async def _fast_settings(url: str) -> Settings:
    return api_settings(
        Settings(database_url=url),
        connect_timeout_seconds=2,
        statement_timeout_seconds=2,
        pool_min_size=1,
        pool_max_size=2,
    )


async def assert_unavailable(client) -> None:
    for method, path, kw in REQUESTS:
        started = time.perf_counter()
        r = await client.request(method, path, **kw)
        elapsed = time.perf_counter() - started
        assert_error(r, 503, "DATABASE_UNAVAILABLE")
        assert int(r.headers["retry-after"]) > 0
        assert elapsed < OUTAGE_BOUND_SECONDS, (method, path, elapsed)
    r = await client.get("/readyz")
    assert_error(r, 503, "DATABASE_UNAVAILABLE")
    assert int(r.headers["retry-after"]) > 0
    # Liveness does not depend on the database.
    assert (await client.get("/healthz")).status_code == 200


async def wait_until_available(client) -> None:
    """The API answers 200 again, and only 503 until then."""
    async def recovered() -> bool:
        r = await client.get("/v1/executions/e1")
        assert r.status_code in (200, 503), (r.status_code, r.text)
        return r.status_code == 200

    await wait_until(recovered, timeout=OUTAGE_BOUND_SECONDS, interval=0.1,
                     what="the API to recover")


async def test_postgres_stopped_and_started_again(embedded_server, make_client):
    admin = await asyncpg.connect(embedded_server.url)
    try:
        await admin.execute("CREATE DATABASE fp_outage")
    finally:
        await admin.close()
    url = embedded_server.url_for("fp_outage")
    await upgrade(url)
    client = await make_client(await _fast_settings(url), raise_app_exceptions=False)
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "e1"})
    assert r.status_code == 201, r.text

    await asyncio.to_thread(embedded_server.stop)
    await assert_unavailable(client)
    # Repeated requests stay 503 (no state goes bad in between).
    await assert_unavailable(client)

    await asyncio.to_thread(embedded_server.start)
    await wait_until_available(client)
    for method, path, kw in REQUESTS:
        r = await client.request(method, path, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
    assert (await client.get("/readyz")).status_code == 200
    # Nothing was admitted while the database was away, and the admission after is there.
    listing = (await client.get("/v1/executions")).json()
    assert {e["executionId"] for e in listing["executions"]} == {"e1", "during"}


async def test_postgres_killed_abruptly(embedded_server, make_client):
    url = embedded_server.url_for("postgres")
    await upgrade(url)
    client = await make_client(await _fast_settings(url), raise_app_exceptions=False)
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "e1"})
    assert r.status_code == 201, r.text
    # Throw-away servers run with synchronous_commit=off: flush before crashing it.
    admin = await asyncpg.connect(url)
    try:
        await admin.execute("CHECKPOINT")
    finally:
        await admin.close()
    await asyncio.to_thread(embedded_server.stop, "immediate")
    await assert_unavailable(client)
    await asyncio.to_thread(embedded_server.start)
    await wait_until_available(client)


async def test_database_dropped_under_the_app(settings, pg_admin, database_url, make_client):
    client = await make_client(
        api_settings(settings, connect_timeout_seconds=2, statement_timeout_seconds=2),
        raise_app_exceptions=False,
    )
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "e1"})
    assert r.status_code == 201, r.text
    name = urlsplit(database_url).path.lstrip("/")
    await pg_admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await assert_unavailable(client)


async def test_statement_timeout_is_503(settings, make_client, pool):
    """A statement that outlives statement_timeout is cancelled: 503, not 500."""
    client = await make_client(
        api_settings(settings, statement_timeout_seconds=0.5),
        raise_app_exceptions=False,
    )
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "e1"})
    assert r.status_code == 201, r.text
    # Hold the row lock so a wake (UPDATE) must wait past the statement timeout.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM executions WHERE execution_id = 'e1' FOR UPDATE")
        started = time.perf_counter()
        r = await client.post("/v1/executions/e1/wakes")
        elapsed = time.perf_counter() - started
    assert_error(r, 503, "DATABASE_UNAVAILABLE")
    assert r.headers["retry-after"]
    assert elapsed < OUTAGE_BOUND_SECONDS
    assert (await client.post("/v1/executions/e1/wakes")).status_code == 200
