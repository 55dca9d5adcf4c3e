"""One Postgres standing in for Citus, for tests of what a claimer or writer
does shard by shard without a cluster."""

from __future__ import annotations

import asyncpg

from app.store.on_shard import OnShard


async def stand_in_citus(database_url: str, shard_of_bucket: str,
                         statements: list[OnShard]) -> None:
    """One Postgres standing in for Citus: every shard's tables are the tables
    themselves, a bucket's shard ID is `shard_of_bucket` (SQL over `b`), and
    `statements` have their on-shard functions."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "CREATE FUNCTION fencepost_shard(t text, b smallint) RETURNS text "
            "LANGUAGE sql AS 'SELECT t'")
        await conn.execute(
            "CREATE FUNCTION get_shard_id_for_distribution_column(t text, b smallint) "
            f"RETURNS bigint LANGUAGE sql AS 'SELECT ({shard_of_bucket})::bigint'")
        for statement in statements:
            await conn.execute(statement.ddl())
    finally:
        await conn.close()
