"""Citus: spreading the schema over a cluster (`fencepost migrate --citus`).

Every per-execution table is distributed by `bucket` (migration 0010), all
co-located with `executions`: the rows of one execution, in every table, sit
on one shard, so a statement that names the execution's bucket is a router
query on one node. The small shared tables (tokens, workers, queues, settings,
schedules, operations, maintenance leases) become reference tables, copied to
every node, so a statement on one shard can still join them. The schema
itself (columns, indexes, functions) is the same as on one Postgres.

The same call distributes a fresh cluster's database and moves an existing
single-node database onto Citus: `create_distributed_table` copies the rows
already there into the shards (the coordinator's local copies are then
truncated). Run it again at any time: what is distributed already is left as
it is.
"""

from __future__ import annotations

import asyncpg

import app.store  # noqa: F401 - defines every OnShard statement
from app.db import asyncpg_dsn
from app.migrate import MIGRATION_LOCK_KEY
from app.store.buckets import PER_EXECUTION
from app.store.on_shard import QUIET_NOTIFY_FUNCTION, REGISTRY, SHARD_FUNCTION

# PER_EXECUTION: distributed by bucket, co-located with executions (the
# foreign keys to executions hold on each shard: both sides carry the same bucket).
# Copied to every node (referenced tables before the tables referencing them).
REFERENCE = (
    "api_tokens", "ui_sessions", "workers", "shared_settings", "schedules", "schedule_events",
    "operations", "operation_items", "maintenance_leases", "queues", "queue_starts",
    "queue_changes",
)
# The schema's functions, created on every node so that a statement pushed
# down to a shard can call them.
FUNCTIONS = (
    "fencepost_bucket(text)",
    "fencepost_cleanup_ends(timestamptz, timestamptz, double precision)",
    "fencepost_redelivery_delay(integer, double precision, double precision)",
)


class CitusMissing(RuntimeError):
    pass


async def is_distributed(conn: asyncpg.Connection) -> bool:
    """Whether this database's executions are distributed by Citus."""
    has_citus = await conn.fetchval(
        "SELECT true FROM pg_extension WHERE extname = 'citus'")
    if not has_citus:
        return False
    return bool(await conn.fetchval(
        "SELECT true FROM pg_dist_partition WHERE logicalrelid = 'executions'::regclass"))


_NO_CITUS = (
    "this database has no citus extension: on the coordinator, run `CREATE EXTENSION "
    "citus` and add the worker nodes (SELECT citus_add_node(host, port)) in this database "
    "first, then `fencepost migrate --citus` again")


async def require_citus(url: str) -> None:
    """Raise CitusMissing (what to do) unless the database at `url` has citus."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        if not await conn.fetchval("SELECT true FROM pg_extension WHERE extname = 'citus'"):
            raise CitusMissing(_NO_CITUS)
    finally:
        await conn.close()


# Shards per worker node when `--shards` is not given. Every batch (a group
# commit of step writes, acknowledgements, admissions) and every claim makes
# one round trip per shard it reaches, so fewer shards is faster; more lets
# more nodes share the load later without splitting shards. Measured on a
# 1+2 cluster (fencepost bench, 1,000 executions): 32 shards (Citus'
# default) 140 executions/s, 4 shards 285/s.
SHARDS_PER_NODE = 2


async def distribute(url: str, shards: int | None = None) -> list[str]:
    """Distribute the (migrated) schema in the database at `url` over its
    Citus cluster; returns what it changed, one line each. `shards`: how many
    shards the executions (and every co-located table) are spread over when
    first distributed (None: SHARDS_PER_NODE per worker node); later runs
    leave the shards as they are (split or move them with Citus)."""
    if shards is not None and not 1 <= shards <= 4096:
        raise ValueError(f"--shards must be between 1 and 4096, not {shards}")
    conn = await asyncpg.connect(asyncpg_dsn(url))
    changed: list[str] = []
    try:
        if not await conn.fetchval("SELECT true FROM pg_extension WHERE extname = 'citus'"):
            raise CitusMissing(_NO_CITUS)
        # Concurrent `fencepost migrate` runs queue behind each other.
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            for signature in FUNCTIONS:
                if not await conn.fetchval(
                        "SELECT true FROM pg_dist_object WHERE classid = 'pg_proc'::regclass "
                        "AND objid = $1::regprocedure", signature):
                    await conn.execute("SELECT create_distributed_function($1)", signature)
                    changed.append(f"function {signature}: created on every node")
            done = {r["t"]: r["m"] for r in await conn.fetch(
                "SELECT logicalrelid::regclass::text AS t, partmethod AS m FROM pg_dist_partition")}
            moved: list[str] = []
            if "executions" not in done:
                # A unique index must include the distribution column: one
                # child per (parent, step key) cannot be an index across
                # shards. KNOWN GAP (issue 21, not yet built): on Citus that
                # rule needs a row on the parent's shard (see README, Scaling out).
                await conn.execute("DROP INDEX IF EXISTS ux_executions_parent_step")
                await conn.execute(
                    "CREATE INDEX IF NOT EXISTS ix_executions_parent_step ON executions "
                    "(parent_execution_id, parent_step_key) WHERE parent_execution_id IS NOT NULL")
                changed.append("ux_executions_parent_step: not unique on Citus (known gap)")
            if "executions" not in done and shards is None:
                nodes = await conn.fetchval(
                    "SELECT count(*) FROM pg_dist_node "
                    "WHERE groupid <> 0 AND noderole = 'primary' AND isactive")
                shards = SHARDS_PER_NODE * max(1, nodes)
            for table in PER_EXECUTION:
                if table in done:
                    continue
                if table == "executions":
                    await conn.execute(
                        "SELECT create_distributed_table('executions', 'bucket', "
                        "colocate_with => 'none', shard_count => $1)", shards)
                    changed.append(f"executions: distributed by bucket over {shards} shards")
                else:
                    await conn.execute(
                        "SELECT create_distributed_table($1, 'bucket', "
                        "colocate_with => 'executions')", table)
                    changed.append(f"{table}: distributed by bucket")
                moved.append(table)
            for table in REFERENCE:
                if table in done:
                    continue
                await conn.execute("SELECT create_reference_table($1)", table)
                changed.append(f"{table}: reference table")
                moved.append(table)
            # Rows that were there before are in the shards now (Citus copied
            # them); the coordinator's own copies go, referencing tables first.
            for table in reversed(moved):
                await conn.execute("SELECT truncate_local_data_after_distributing_table($1)",
                                   table)
            # The statements that run on their shard (app/store/on_shard.py):
            # made again each time, so an upgrade brings its new text.
            await conn.execute(SHARD_FUNCTION)
            await _delegate(conn, "fencepost_shard(text, smallint)", None)
            await conn.execute(QUIET_NOTIFY_FUNCTION)
            await _delegate(conn, "fencepost_quiet_notify(text, text)", None)
            for statement in REGISTRY.values():
                try:
                    await conn.execute(statement.ddl())
                except asyncpg.InvalidFunctionDefinitionError:
                    # Its answer's columns changed (a new release): a function
                    # cannot be replaced by one of another row type.
                    await conn.execute(f"DROP FUNCTION {statement.signature}")
                    await conn.execute(statement.ddl())
                    changed.append(f"{statement.function}: made anew (its columns changed)")
                await _delegate(conn, statement.signature, "$1")
            changed.append(f"{len(REGISTRY)} statements run on their shard "
                           f"({', '.join(sorted(REGISTRY))})")
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()
    return changed



async def _delegate(conn: asyncpg.Connection, signature: str, argument: str | None) -> None:
    """Create the function on every node; with `argument`, calls of it are
    delegated by that argument (a bucket) to the node of its shard, also
    inside a transaction (force_delegation)."""
    if argument is None:
        await conn.execute("SELECT create_distributed_function($1)", signature)
        return
    await conn.execute(
        "SELECT create_distributed_function($1, $2, colocate_with => 'executions', "
        "force_delegation => true)", signature, argument)
