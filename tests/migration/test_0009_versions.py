"""Revision 0009 (versions) upgrades a database holding data: recorded steps
keep their rows with no position (a replay does not compare them by
position), executions keep their code version and have no park detail,
registered workers carry no versions ({}); the claim (once the database
is at head) then routes the existing executions by the version they were
admitted under. It downgrades with the three columns gone and every row
intact."""

from __future__ import annotations

import asyncpg

from app import migrate
from app.store import ExecutionStore


async def test_0009_upgrades_and_downgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0008")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, due_at,
                                    outcome, code_version, parked_reason, parked_step)
            VALUES ('v1', 'w', '{}', 'admitted', now(), NULL, '1', NULL, NULL),
                   ('plain', 'w', '{}', 'admitted', now(), NULL, NULL, NULL, NULL),
                   ('stuck', 'w', '{}', 'parked', NULL, NULL, '1', 'outcome_unknown', 'pay'),
                   ('done', 'w', '{}', 'completed', NULL, '{"result": 1}', '1', NULL, NULL);
            INSERT INTO execution_steps (execution_id, step_key, status, value, function_name,
                                         token)
            VALUES ('v1', 'a', 'completed', '"A"', 'load', 1),
                   ('v1', 'nap', 'completed', '"2026-01-01T00:00:00+00:00"', 'sleep', 1),
                   ('done', 'a', 'completed', '1', 'load', 1);
            INSERT INTO workers (worker_id, host, pid, workflows, concurrency)
            VALUES ('old-worker', 'h', 1, '["w"]', 4);
            """)
    finally:
        await conn.close()

    await migrate.upgrade(url, "0009")

    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        steps = await pool.fetch(
            "SELECT execution_id, step_key, value, position FROM execution_steps "
            "ORDER BY execution_id, step_key")
        assert [(r["execution_id"], r["step_key"], r["position"]) for r in steps] == [
            ("done", "a", None), ("v1", "a", None), ("v1", "nap", None)]
        assert [r["value"] for r in steps] == ["1", '"A"', '"2026-01-01T00:00:00+00:00"']
        rows = await pool.fetch(
            "SELECT execution_id, status, code_version, parked_reason, parked_step, "
            "parked_detail FROM executions ORDER BY execution_id")
        assert [tuple(r) for r in rows] == [
            ("done", "completed", "1", None, None, None),
            ("plain", "admitted", None, None, None, None),
            ("stuck", "parked", "1", "outcome_unknown", "pay", None),
            ("v1", "admitted", "1", None, None, None),
        ]
        worker = await pool.fetchrow(
            "SELECT workflows::text, versions::text FROM workers WHERE worker_id = 'old-worker'")
        assert tuple(worker) == ('["w"]', "{}")
    finally:
        await pool.close()

    # The store's statements are written for the head schema: claim there.
    await migrate.upgrade(url)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        # The existing executions route by the version they were admitted
        # under: a caller carrying version 2 of w takes only the unversioned
        # one; a caller carrying version 1 takes the versioned one.
        leases = ExecutionStore(pool).leases
        on_v2 = await leases.claim_due(10, 30.0, "w2", ["w"], None, ["2"])
        assert [d.lease.execution_id for d in on_v2] == ["plain"]
        on_v1 = await leases.claim_due(10, 30.0, "w1", ["w"], None, ["1"])
        assert [d.lease.execution_id for d in on_v1] == ["v1"]
    finally:
        await pool.close()

    await migrate.downgrade(url, "0008")
    conn = await asyncpg.connect(url)
    try:
        gone = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE (table_name, column_name) IN (('execution_steps', 'position'), "
            "('executions', 'parked_detail'), ('workers', 'versions'))")
        assert gone == []
        assert await conn.fetchval("SELECT count(*) FROM executions") == 4
        assert await conn.fetchval("SELECT count(*) FROM execution_steps") == 3
        assert await conn.fetchval(
            "SELECT workflows::text FROM workers WHERE worker_id = 'old-worker'") == '["w"]'
        assert await conn.fetchval(
            "SELECT code_version FROM executions WHERE execution_id = 'v1'") == "1"
    finally:
        await conn.close()
