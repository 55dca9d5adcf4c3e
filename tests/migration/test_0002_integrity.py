"""Revision 0002 (children unique per parent step, retired IDs, integrity
conflicts) upgrades a database that already holds data from 0001: rows are
kept, the new columns take their defaults, and children that 0001 allowed
twice for one (parent, step key) are reduced to one linked child (the one
the parent's step recorded), so the new unique index can be built."""

from __future__ import annotations

import json

import asyncpg
import pytest

from app import migrate


async def _seed_0001(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, outcome, token)
            VALUES ('done-1', 'wf', '{}'::jsonb, 'completed', '{"result": 1}'::jsonb, 3);
            INSERT INTO executions (execution_id, workflow_id, params, status, token,
                                    lease_owner, lease_expires_at)
            VALUES ('parent', 'wf', '{}'::jsonb, 'running', 2, 'w', now() + interval '1 minute');
            -- 0001 let a stale holder start a second child for the same step.
            INSERT INTO executions (execution_id, workflow_id, params, status, due_at,
                                    parent_execution_id, parent_step_key, admitted_at)
            VALUES ('stale-child', 'child', '{}'::jsonb, 'admitted', now(), 'parent', 'start',
                    now() - interval '2 minutes'),
                   ('kept-child', 'child', '{}'::jsonb, 'admitted', now(), 'parent', 'start',
                    now() - interval '1 minute'),
                   ('other-child', 'child', '{}'::jsonb, 'admitted', now(), 'parent', 'other',
                    now());
            -- The parent's receipt names the child it kept.
            INSERT INTO execution_steps (execution_id, step_key, status, value, token)
            VALUES ('parent', 'start', 'completed', '"kept-child"'::jsonb, 2);
            INSERT INTO late_observations (execution_id, step_key, token, owner, value)
            VALUES ('parent', 'start', 1, 'old', '"stale-child"'::jsonb);
            INSERT INTO execution_events (execution_id, kind) VALUES ('done-1', 'admitted');
            """
        )
    finally:
        await conn.close()


async def test_0002_upgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0001")
    await _seed_0001(url)

    await migrate.upgrade(url, "0002")

    assert await migrate.current_revision(url) == "0002"
    conn = await asyncpg.connect(url)
    try:
        rows = {r["execution_id"]: dict(r) for r in await conn.fetch(
            "SELECT execution_id, status, token, integrity_conflicts, parent_execution_id, "
            "parent_step_key FROM executions")}
        assert set(rows) == {"done-1", "parent", "stale-child", "kept-child", "other-child"}
        assert {r["integrity_conflicts"] for r in rows.values()} == {0}
        assert (rows["done-1"]["status"], rows["done-1"]["token"]) == ("completed", 3)
        # One linked child per (parent, step key): the one the receipt names.
        assert (rows["kept-child"]["parent_execution_id"],
                rows["kept-child"]["parent_step_key"]) == ("parent", "start")
        assert (rows["other-child"]["parent_execution_id"],
                rows["other-child"]["parent_step_key"]) == ("parent", "other")
        # The duplicate stays (nothing is deleted), still under its parent
        # (a cancel reaches it), but no longer holds the step's link.
        assert (rows["stale-child"]["parent_execution_id"],
                rows["stale-child"]["parent_step_key"]) == ("parent", None)
        detached = await conn.fetch(
            "SELECT detail FROM execution_events WHERE execution_id = 'stale-child' "
            "AND kind = 'child_link_detached'")
        assert [json.loads(r["detail"]) for r in detached] == [
            {"parentStepKey": "start", "keptExecutionId": "kept-child",
             "parentExecutionId": "parent"}]

        assert await conn.fetchval("SELECT conflict FROM late_observations") is None
        assert await conn.fetchval("SELECT count(*) FROM retired_executions") == 0
        assert await conn.fetchval(
            "SELECT count(*) FROM execution_events WHERE execution_id = 'done-1'") == 1

        # The new index holds from now on.
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO executions (execution_id, workflow_id, params, "
                "parent_execution_id, parent_step_key) "
                "VALUES ('third', 'child', '{}'::jsonb, 'parent', 'start')")
        await conn.execute(
            "INSERT INTO retired_executions (execution_id, last_token, workflow_id) "
            "VALUES ('gone', 7, 'wf')")
        assert await conn.fetchval(
            "SELECT retired_at <= now() FROM retired_executions WHERE execution_id = 'gone'")
    finally:
        await conn.close()


async def test_0002_downgrades_to_0001_and_upgrades_again_with_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0001")
    await _seed_0001(url)
    await migrate.upgrade(url)

    await migrate.downgrade(url, "0001")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT to_regclass('retired_executions')") is None
        assert await conn.fetchval("SELECT count(*) FROM executions") == 5
    finally:
        await conn.close()

    await migrate.upgrade(url)
    assert await migrate.is_at_head(url)
