"""Revision 0010 (buckets) upgrades a database holding data in every
per-execution table: each row gets its execution's bucket, the one
app.store.buckets.bucket_of computes; no row is lost; the bucket joins each
primary key and foreign key, deleting an execution still deletes its rows in
the tables that reference it, and a row in another bucket than its
execution's is refused. It downgrades with the column, the function and the
bucketed keys gone, every row intact and the 0009 constraints back."""

from __future__ import annotations

import asyncpg
import pytest

from app import migrate
from app.store.buckets import BUCKETS, bucket_of

# The tables holding one execution's rows: (table, its row key at 0009).
PER_EXECUTION = {
    "executions": ("execution_id",),
    "execution_steps": ("execution_id", "step_key"),
    "execution_events": ("event_id",),
    "late_observations": ("observation_id",),
    "retired_executions": ("execution_id",),
    "signals": ("signal_id",),
    "effects": ("execution_id", "step_key"),
    "attempt_history": ("attempt_id",),
    "superseded_steps": ("superseded_id",),
    "watched_executions": ("execution_id",),
}
# The tables whose rows reference their execution (deleted with it).
REFERENCING = ("execution_steps", "signals", "effects", "attempt_history",
               "superseded_steps", "watched_executions")

PARENT, CHILD, DONE, ODD, GONE = "parent", "parent~start", "done-1", "ünïcødé-🚀/42", "gone"

SEED = f"""
INSERT INTO executions (execution_id, workflow_id, params, status, due_at, outcome,
                        token, lease_owner, lease_expires_at, parent_execution_id,
                        parent_step_key, ever_suspended, waiting_on)
VALUES ('{PARENT}', 'parent-wf', '{{}}', 'suspended', NULL, NULL, 1, NULL, NULL, NULL, NULL,
        true, '{{"child": "{CHILD}"}}'),
       ('{CHILD}', 'child-wf', '{{"n": 1}}', 'running', NULL, NULL, 2, 'w1',
        now() + interval '30 seconds', '{PARENT}', 'start', false, NULL),
       ('{DONE}', 'w', '{{}}', 'completed', NULL, '{{"result": 1}}', 3, NULL, NULL, NULL, NULL,
        false, NULL),
       ('{ODD}', 'w', '{{}}', 'admitted', now(), NULL, 0, NULL, NULL, NULL, NULL, false, NULL);
INSERT INTO execution_steps (execution_id, step_key, status, value, error, function_name,
                             token, position)
VALUES ('{PARENT}', 'load', 'completed', '"A"', NULL, 'load', 1, 0),
       ('{CHILD}', 'one', 'completed', '1', NULL, 'one', 2, 0),
       ('{CHILD}', 'two', 'failed', NULL, '{{"name": "E"}}', 'two', 2, 1),
       ('{DONE}', 'a', 'completed', '1', NULL, 'a', 3, 0);
INSERT INTO execution_events (execution_id, kind, token, detail)
VALUES ('{PARENT}', 'admitted', NULL, NULL), ('{PARENT}', 'claimed', 1, '{{}}'),
       ('{CHILD}', 'admitted', NULL, NULL), ('{DONE}', 'acknowledged', 3,
        '{{"status": "completed"}}'), ('{ODD}', 'admitted', NULL, NULL),
       ('{GONE}', 'acknowledged', 7, '{{"status": "completed"}}');
INSERT INTO late_observations (execution_id, step_key, token, owner, value, conflict)
VALUES ('{DONE}', 'a', 2, 'old-worker', '1', false),
       ('{CHILD}', 'one', 1, 'w0', '2', true);
INSERT INTO retired_executions (execution_id, last_token, workflow_id)
VALUES ('{GONE}', 7, 'wf'), ('retired-2', 1, 'wf');
INSERT INTO signals (execution_id, name, payload, consumed_step, consumed_token, consumed_at)
VALUES ('{PARENT}', 'go', '1', NULL, NULL, NULL), ('{PARENT}', 'go', '2', 'wait', 1, now()),
       ('{ODD}', 'ping', 'null', NULL, NULL, NULL);
INSERT INTO effects (execution_id, step_key, idempotency_key, function_name, status, token)
VALUES ('{CHILD}', 'charge', 'k-1', 'charge', 'outcome_unknown', 2),
       ('{PARENT}', 'mail', 'k-2', 'mail', 'started', 1);
INSERT INTO attempt_history (execution_id, step_key, attempt, token, error)
VALUES ('{CHILD}', 'two', 1, 2, '{{"name": "E"}}'), ('{CHILD}', 'two', 2, 2, '{{"name": "E"}}'),
       ('{DONE}', NULL, 1, 2, '{{"name": "LeaseLost"}}');
INSERT INTO superseded_steps (execution_id, step_key, status, value, function_name, attempts,
                              token, recorded_at, redrive)
VALUES ('{DONE}', 'a', 'completed', '0', 'a', 1, 1, now() - interval '1 hour', 1),
       ('{CHILD}', 'one', 'completed', '0', 'one', 1, 1, now() - interval '1 hour', 1);
INSERT INTO watched_executions (execution_id) VALUES ('{PARENT}'), ('{CHILD}'), ('{ODD}');
"""


async def _rows(conn: asyncpg.Connection) -> dict[str, list[tuple]]:
    """Every row of every per-execution table, as text, in key order (the
    bucket left out, so the same rows compare equal on either revision)."""
    found = {}
    for table, key in PER_EXECUTION.items():
        rows = await conn.fetch(
            f"SELECT to_jsonb(t) - 'bucket' AS row FROM {table} t ORDER BY {', '.join(key)}")
        found[table] = [r["row"] for r in rows]
    return found


async def _constraints(conn: asyncpg.Connection) -> dict[tuple[str, str], str]:
    rows = await conn.fetch(
        "SELECT conrelid::regclass::text AS t, conname, pg_get_constraintdef(oid) AS def "
        "FROM pg_constraint WHERE conrelid::regclass::text = ANY($1::text[])",
        list(PER_EXECUTION))
    return {(r["t"], r["conname"]): r["def"] for r in rows}


async def test_0010_upgrades_and_downgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0009")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(SEED)
        before = await _rows(conn)
        constraints_0009 = await _constraints(conn)
    finally:
        await conn.close()
    # The seed fills every table and spreads over more than one bucket.
    assert all(before.values()), {t: len(r) for t, r in before.items()}
    assert len({bucket_of(i) for i in (PARENT, CHILD, DONE, ODD, GONE)}) > 1

    await migrate.upgrade(url, "0010")

    conn = await asyncpg.connect(url)
    try:
        # Nothing lost or changed; each row in its execution's bucket.
        assert await _rows(conn) == before
        for table in PER_EXECUTION:
            rows = await conn.fetch(f"SELECT execution_id, bucket FROM {table}")
            assert [(r["execution_id"], r["bucket"]) for r in rows] == [
                (r["execution_id"], bucket_of(r["execution_id"])) for r in rows], table
            assert all(0 <= r["bucket"] < BUCKETS for r in rows)

        # The bucket is part of each primary key and of each reference.
        constraints = await _constraints(conn)
        for table, key in PER_EXECUTION.items():
            assert constraints[(table, f"pk_{table}")] == (
                f"PRIMARY KEY ({', '.join(key)}, bucket)"), table
        for table in REFERENCING:
            assert constraints[(table, f"fk_{table}_execution_id")] == (
                "FOREIGN KEY (execution_id, bucket) REFERENCES executions(execution_id, bucket) "
                "ON DELETE CASCADE"), table

        # A row in another bucket than its execution's is refused, in every table.
        for table, key in PER_EXECUTION.items():
            with pytest.raises(asyncpg.CheckViolationError) as refused:
                await conn.execute(
                    f"UPDATE {table} SET bucket = (bucket + 1) % {BUCKETS} "
                    f"WHERE ({', '.join(key)}) = (SELECT {', '.join(key)} FROM {table} "
                    f"ORDER BY {', '.join(key)} LIMIT 1)")
            assert refused.value.constraint_name == f"ck_{table}_bucket_of_execution"
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO executions (execution_id, bucket, workflow_id, params) "
                "VALUES ('new', $1, 'w', '{}')", (bucket_of("new") + 1) % BUCKETS)
        with pytest.raises(asyncpg.NotNullViolationError):
            await conn.execute(
                "INSERT INTO executions (execution_id, workflow_id, params) "
                "VALUES ('new', 'w', '{}')")
        await conn.execute(
            "INSERT INTO executions (execution_id, bucket, workflow_id, params) "
            "VALUES ('new', fencepost_bucket('new'), 'w', '{}')")
        assert await conn.fetchval(
            "SELECT bucket FROM executions WHERE execution_id = 'new'") == bucket_of("new")
        assert await _rows(conn) != before  # 'new' is there
        await conn.execute("DELETE FROM executions WHERE execution_id = 'new'")
        assert await _rows(conn) == before  # and the refused writes changed nothing

        # Deleting an execution still deletes its rows where they reference it,
        # and nothing of any other execution (undone after: the downgrade gets every row).
        deletion = conn.transaction()
        await deletion.start()
        others = {t: await conn.fetchval(
            f"SELECT count(*) FROM {t} WHERE execution_id <> $1", CHILD) for t in REFERENCING}
        assert all([await conn.fetchval(
            f"SELECT count(*) FROM {t} WHERE execution_id = $1", CHILD) > 0
            for t in REFERENCING if t != "signals"])
        assert await conn.execute(
            "DELETE FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)",
            CHILD) == "DELETE 1"
        for table in REFERENCING:
            assert await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE execution_id = $1", CHILD) == 0, table
            assert await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE execution_id <> $1", CHILD
            ) == others[table], table
        # The parent's signals go with it.
        assert await conn.execute(
            "DELETE FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)",
            PARENT) == "DELETE 1"
        assert await conn.fetchval(
            "SELECT count(*) FROM signals WHERE execution_id = $1", PARENT) == 0
        await deletion.rollback()
        assert await _rows(conn) == before
    finally:
        await conn.close()

    await migrate.downgrade(url, "0009")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns WHERE column_name = 'bucket' "
            "AND table_name = ANY($1::text[])", list(PER_EXECUTION)) == 0
        assert await conn.fetchval("SELECT to_regproc('fencepost_bucket')") is None
        assert await _rows(conn) == before
        assert await _constraints(conn) == constraints_0009
        # The 0009 keys hold again: one row per execution ID.
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO executions (execution_id, workflow_id, params) "
                "VALUES ($1, 'w', '{}')", DONE)
    finally:
        await conn.close()
    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
