"""Revision 0007 (maintenance leases) upgrades a database holding data: the
executions and workers keep their rows, the leases table starts empty and
takes a lease, and it downgrades with the table gone and the rest intact."""

from __future__ import annotations

import asyncpg

from app import migrate


async def test_0007_upgrades_and_downgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0006")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status)
            VALUES ('old', 'w', '{}', 'admitted');
            INSERT INTO workers (worker_id, host, pid, workflows, concurrency)
            VALUES ('w1', 'h', 1, '["w"]', 4);
            """)
    finally:
        await conn.close()

    await migrate.upgrade(url, "0007")

    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM maintenance_leases") == 0
        await conn.execute(
            "INSERT INTO maintenance_leases (role, holder, token, expires_at) "
            "VALUES ('sweeps', 'w1', 1, now() + interval '15 seconds')")
        row = await conn.fetchrow("SELECT holder, token, acquired_at <= now() AS since "
                                  "FROM maintenance_leases")
        assert dict(row) == {"holder": "w1", "token": 1, "since": True}
        assert await conn.fetchval("SELECT status FROM executions") == "admitted"
    finally:
        await conn.close()

    await migrate.downgrade(url, "0006")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT to_regclass('maintenance_leases')") is None
        assert await conn.fetchval("SELECT count(*) FROM executions") == 1
        assert await conn.fetchval("SELECT count(*) FROM workers") == 1
    finally:
        await conn.close()
