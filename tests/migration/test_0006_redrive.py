"""Revision 0006 (redrive) upgrades a database holding data: executions keep
their rows with no redrives and no fork source, the superseded history
starts empty and takes rows, and it downgrades with both gone."""

from __future__ import annotations

import asyncpg

from app import migrate


async def test_0006_upgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0005")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, outcome)
            VALUES ('old', 'w', '{}', 'failed', '{"error": {"name": "E"}}');
            INSERT INTO execution_steps (execution_id, step_key, status, error, token)
            VALUES ('old', 'ship', 'failed', '{"name": "E"}', 1);
            """)
    finally:
        await conn.close()

    await migrate.upgrade(url, "0006")

    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT redrives, forked_from, forked_from_step FROM executions")
        assert dict(row) == {"redrives": 0, "forked_from": None, "forked_from_step": None}
        await conn.execute(
            "INSERT INTO superseded_steps (execution_id, step_key, status, attempts, token, "
            "recorded_at, redrive) SELECT execution_id, step_key, status, attempts, token, "
            "recorded_at, 1 FROM execution_steps")
        assert await conn.fetchval("SELECT count(*) FROM superseded_steps") == 1
    finally:
        await conn.close()

    await migrate.downgrade(url, "0005")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT to_regclass('superseded_steps')") is None
        assert await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'executions' "
            "AND column_name IN ('redrives', 'forked_from', 'forked_from_step')") == 0
        assert await conn.fetchval("SELECT count(*) FROM execution_steps") == 1
    finally:
        await conn.close()
