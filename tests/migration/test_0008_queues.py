"""Revision 0008 (queues) upgrades a database holding data: existing
executions land on the `default` queue with priority 0 and no key, and are
claimed by the new claim as before (once the database is at head); it
downgrades with the flow-control columns and tables gone and the executions
intact."""

from __future__ import annotations

import asyncpg

from app import migrate
from app.store import ExecutionStore


async def test_0008_upgrades_and_downgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0007")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, due_at, outcome)
            VALUES ('due', 'w', '{}', 'admitted', now(), NULL),
                   ('done', 'w', '{}', 'completed', NULL, '{"result": 1}');
            """)
    finally:
        await conn.close()

    await migrate.upgrade(url, "0008")

    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        rows = await pool.fetch(
            "SELECT execution_id, queue, concurrency_key, priority FROM executions "
            "ORDER BY execution_id")
        assert [tuple(r) for r in rows] == [("done", "default", None, 0),
                                           ("due", "default", None, 0)]
        assert await pool.fetchval("SELECT name FROM queue_settings") == "default"
    finally:
        await pool.close()

    # The store's statements are written for the head schema: claim there.
    await migrate.upgrade(url)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        claimed = await ExecutionStore(pool).leases.claim_due(10, 30.0, "w1")
        assert [d.lease.execution_id for d in claimed] == ["due"]
    finally:
        await pool.close()

    await migrate.downgrade(url, "0007")
    conn = await asyncpg.connect(url)
    try:
        for table in ("queues", "queue_starts", "queue_changes", "queue_settings"):
            assert await conn.fetchval("SELECT to_regclass($1)", table) is None
        assert await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'executions' AND column_name IN ('queue', 'priority')") == 0
        assert await conn.fetchval("SELECT count(*) FROM executions") == 2
    finally:
        await conn.close()
