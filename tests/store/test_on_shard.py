"""OnShard statements (app/store/on_shard.py) on one Postgres: what each
declares of its parameters and answer is what Postgres describes for its
text, and the function `fencepost migrate --citus` makes of it answers
exactly what the statement does when sent as it is (checked here with a
stand-in `fencepost_shard` that names the table itself: one Postgres is one
shard)."""

from __future__ import annotations

import asyncpg
import pytest

# Importing the store defines them all.
import app.store  # noqa: F401, I001
from app.store.on_shard import REGISTRY, OnShard
from app.store.types import Lease
from tests.support.admission import admit
from tests.support.claims import claim_one
from tests.support.stand_in_citus import stand_in_citus


def test_every_statement_is_registered_once_and_names_its_tables():
    assert {"write_steps", "write_steps_skip_locked", "recorded_steps"} <= set(REGISTRY)
    for statement in REGISTRY.values():
        assert statement.tables, statement.name
        assert statement.ddl().count("RETURN QUERY EXECUTE format('EXECUTE %I(") == 1
    with pytest.raises(ValueError, match="two statements"):
        OnShard("write_steps", "SELECT 1 FROM executions", (), (("x", "int"),))


@pytest.mark.parametrize("name", sorted(REGISTRY))
async def test_declared_types_are_what_postgres_describes(database_url, name):
    statement = REGISTRY[name]
    conn = await asyncpg.connect(database_url)
    try:
        prepared = await conn.prepare(statement.sql)
        params = [t.name for t in prepared.get_parameters()]
        columns = [(a.name, a.type.name) for a in prepared.get_attributes()]
    finally:
        await conn.close()
    # As asyncpg names them.
    aliases = {"bigint": "int8", "integer": "int4", "smallint": "int2", "boolean": "bool",
               "float8": "float8"}

    def named(sql_type: str) -> str:
        base, array = (sql_type[:-2], "[]") if sql_type.endswith("[]") else (sql_type, "")
        return aliases.get(base, base) + array

    assert params == [named(t) for t in statement.params]
    assert columns == [(c, named(t)) for c, t in statement.columns]


async def test_the_function_answers_what_the_statement_answers(database_url, store):
    await stand_in_citus(database_url, "1", list(REGISTRY.values()))
    eid = await admit(store, "wf", "on-shard-1")
    lease = (await claim_one(store, eid)).lease
    write = REGISTRY["write_steps"]
    args = ([eid, eid], [lease.token, lease.token], ["a", "b"], ["completed"] * 2,
            ['{"n": 1}', '{"n": 2}'], [None, None], [None, None], [1, 1], [0, 1])
    via_function = await write.fetch(store.pool, [7], *args)
    assert [r["fenced"] for r in via_function] == [True, True]
    assert via_function[0]["step_key"] == "a" and via_function[0]["value"] == {"n": 1}
    # The same writes again, sent as they are: recorded already, so both
    # fenced and not inserted (the first write of a key stands) - as the
    # function answers them the second time.
    direct = await write.fetch(store.pool, None, *args)
    again = await write.fetch(store.pool, [7], *args)
    assert [dict(r) for r in direct] == [dict(r) for r in again]
    assert [r["step_key"] for r in direct] == [None, None]
    # A stale token is refused the same way both ways.
    stale = ([eid], [lease.token + 5], ["c"], ["completed"], ["1"], [None], [None], [1], [2])
    assert [dict(r) for r in await write.fetch(store.pool, None, *stale)] == \
        [dict(r) for r in await write.fetch(store.pool, [7], *stale)]
    recorded = await REGISTRY["recorded_steps"].fetch(store.pool, [7], [eid], ["a"])
    assert [(r["step_key"], r["value"]) for r in recorded] == [("a", {"n": 1})]
    assert isinstance(lease, Lease)


async def test_rows_of_buckets_on_another_shard_are_refused_and_nothing_is_written(
        database_url, store):
    """A caller whose placement is out of date (a shard split since it was
    read) sends rows of a bucket the shard does not hold: refused."""
    # Two "shards": even and odd buckets.
    await stand_in_citus(database_url, "b % 2", [REGISTRY["write_steps"]])
    eid = await admit(store, "wf", "on-shard-2")
    lease = (await claim_one(store, eid)).lease
    args = ([eid], [lease.token], ["a"], ["completed"], ["1"], [None], [None], [1], [0])
    with pytest.raises(asyncpg.PostgresError, match="not all on the shard") as refused:
        await REGISTRY["write_steps"].fetch(store.pool, [4, 5], *args)
    assert refused.value.sqlstate == "FPST1"
    assert await store.pool.fetchval("SELECT count(*) FROM execution_steps") == 0
    # The same rows with buckets of one shard go through.
    assert [r["fenced"] for r in await REGISTRY["write_steps"].fetch(
        store.pool, [4, 6], *args)] == [True]


async def test_each_statement_is_prepared_once_per_session_and_shard(database_url, store):
    """The function prepares its statement on first use in a session, per
    shard, and then only executes it: also after a rollback, which undoes
    the setting that remembers it but not the PREPARE."""
    await stand_in_citus(database_url, "b % 2", [REGISTRY["recorded_steps"]])
    eid = await admit(store, "wf", "prepared-once")
    recorded = REGISTRY["recorded_steps"]
    conn = await asyncpg.connect(database_url)
    try:
        async def prepared() -> list[str]:
            return [r["name"] for r in await conn.fetch(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'fp_recorded_steps_%' "
                "ORDER BY name")]

        assert await recorded.fetch(conn, [4], [eid], ["a"]) == []
        assert len(await prepared()) == 1
        for _ in range(3):
            assert await recorded.fetch(conn, [4], [eid], ["a"]) == []
        assert len(await prepared()) == 1
        # Another "shard" (odd buckets): prepared for it as well.
        await recorded.fetch(conn, [5], [eid], ["a"])
        assert len(await prepared()) == 2
        # Prepared in a transaction that rolled back: kept, and used again.
        other = await asyncpg.connect(database_url)
        try:
            tr = other.transaction()
            await tr.start()
            await recorded.fetch(other, [4], [eid], ["a"])
            await tr.rollback()
            assert await other.fetchval(
                "SELECT current_setting('fencepost.' || name, true) FROM pg_prepared_statements "
                "WHERE name LIKE 'fp_recorded_steps_%'") in (None, "")
            assert await recorded.fetch(other, [4], [eid], ["a"]) == []
            assert await other.fetchval(
                "SELECT count(*) FROM pg_prepared_statements "
                "WHERE name LIKE 'fp_recorded_steps_%'") == 1
        finally:
            await other.close()
    finally:
        await conn.close()


def test_a_table_mentioned_where_it_cannot_be_renamed_is_refused():
    for sql in ("SELECT 1 FROM executions e, execution_steps s",
                "DELETE FROM executions USING execution_events x",
                "SELECT 'moved' FROM executions -- see executions"):
        with pytest.raises(ValueError, match="cannot be renamed"):
            OnShard(f"bad_{abs(hash(sql))}", sql, (), (("x", "int"),))
    statement = OnShard("lower_case_ok", "select 1 from Executions e join execution_steps s "
                        "on true", (), (("x", "int"),))
    assert statement.tables == ("execution_steps", "executions")
    REGISTRY.pop("lower_case_ok")
