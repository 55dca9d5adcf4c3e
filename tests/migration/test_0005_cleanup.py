"""Revision 0005 (cleanup) upgrades a database holding data: every execution
gets the default cleanup window (30 s), `fencepost_cleanup_ends` counts it
from the cancel request or the deadline, the partial index for pending
cancels exists; and it downgrades with the column and function gone."""

from __future__ import annotations

import asyncpg

from app import migrate


async def test_0005_upgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0004")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, due_at, deadline,
                                    cancel_requested_at, token, ever_suspended)
            VALUES ('waits', 'w', '{}', 'suspended', NULL, now() + interval '1 hour', NULL, 1, true),
                   ('cancelling', 'w', '{}', 'suspended', now(), NULL,
                    '2026-12-01T10:00:00Z', 2, true)
            """
        )
    finally:
        await conn.close()

    await migrate.upgrade(url, "0005")

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT execution_id, cleanup_seconds,"
            " fencepost_cleanup_ends(cancel_requested_at, deadline, cleanup_seconds) AS ends,"
            " deadline, cancel_requested_at FROM executions ORDER BY execution_id")
        by_id = {r["execution_id"]: r for r in rows}
        assert {r["cleanup_seconds"] for r in rows} == {30.0}
        waits, cancelling = by_id["waits"], by_id["cancelling"]
        assert (waits["ends"] - waits["deadline"]).total_seconds() == 30
        assert (cancelling["ends"] - cancelling["cancel_requested_at"]).total_seconds() == 30
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_executions_cancel_pending'") == 1
    finally:
        await conn.close()

    await migrate.downgrade(url, "0004")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'executions' AND column_name = 'cleanup_seconds'") == 0
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname = 'fencepost_cleanup_ends'") == 0
        assert await conn.fetchval("SELECT count(*) FROM executions") == 2
    finally:
        await conn.close()
