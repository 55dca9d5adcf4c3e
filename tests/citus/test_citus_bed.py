"""The Citus test bed itself (FENCEPOST_TEST_POSTGRES=citus, see tests/conftest.py): each
test's database is a Citus cluster of its own, its per-execution tables distributed, an
admission lands in one shard on a worker, and two test databases share nothing.

Without a cluster these tests are skipped, with the reason (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import PER_EXECUTION, bucket_of
from tests.conftest import TestServer, with_database

pytestmark = pytest.mark.citus


async def _fetch(url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def _copies_on_each_node(pg_server: TestServer, database_url: str,
                               execution_id: str) -> dict[int, dict[str, int]]:
    """For each node (its index in pg_server.nodes): how many rows of `execution_id` each
    of its `executions` shard tables holds, those that hold any."""
    database = database_url.rsplit("/", 1)[1]
    found: dict[int, dict[str, int]] = {}
    for node, admin_url in enumerate(pg_server.nodes):
        conn = await asyncpg.connect(with_database(admin_url, database))
        try:
            # Shard tables are hidden from the catalog views unless asked for.
            await conn.execute("SET citus.override_table_visibility TO off")
            shards = await conn.fetch(
                "SELECT relname FROM pg_class WHERE relname ~ '^executions_[0-9]+$' "
                "AND relkind = 'r'")
            for shard in shards:
                count = await conn.fetchval(
                    f'SELECT count(*) FROM "{shard["relname"]}" WHERE execution_id = $1',
                    execution_id)
                if count:
                    found.setdefault(node, {})[shard["relname"]] = count
        finally:
            await conn.close()
    return found


async def test_executions_is_distributed_by_bucket(database_url: str) -> None:
    rows = await _fetch(
        database_url,
        "SELECT partmethod::text, column_to_column_name(logicalrelid, partkey) AS column "
        "FROM pg_dist_partition WHERE logicalrelid = 'executions'::regclass")
    assert [(r["partmethod"], r["column"]) for r in rows] == [("h", "bucket")]
    workers = await _fetch(
        database_url,
        "SELECT DISTINCT p.groupid FROM pg_dist_placement p "
        "JOIN pg_dist_shard s USING (shardid) "
        "WHERE s.logicalrelid = 'executions'::regclass")
    assert {r["groupid"] for r in workers} - {0}, "no shard of executions on a worker"


async def test_the_shards_are_two_per_worker_node_and_shared_by_every_table(
        database_url: str) -> None:
    """`fencepost migrate --citus` without --shards: two shards per worker
    node, and every per-execution table co-located with executions."""
    nodes = await _fetch(
        database_url, "SELECT count(*) AS n FROM pg_dist_node "
        "WHERE groupid <> 0 AND noderole = 'primary' AND isactive")
    rows = await _fetch(
        database_url,
        "SELECT p.logicalrelid::text AS t, p.colocationid, count(s.shardid) AS shards "
        "FROM pg_dist_partition p JOIN pg_dist_shard s USING (logicalrelid) "
        "WHERE p.partmethod = 'h' GROUP BY 1, 2")
    assert {r["t"] for r in rows} == set(PER_EXECUTION)
    assert {(r["colocationid"], r["shards"]) for r in rows} == {
        (rows[0]["colocationid"], 2 * nodes[0]["n"])}


async def test_an_admission_lands_in_its_bucket_shard(
        pg_server: TestServer, database_url: str, store: ExecutionStore) -> None:
    execution_id = "citus-bed-1"
    await store.admissions.admit(workflow_id="w", params={"n": 1}, execution_id=execution_id)

    shard = (await _fetch(
        database_url,
        "SELECT s.shardid, p.nodename, p.nodeport FROM pg_dist_shard s "
        "JOIN pg_dist_shard_placement p USING (shardid) "
        "WHERE s.shardid = get_shard_id_for_distribution_column('executions', $1::smallint)",
        bucket_of(execution_id)))[0]
    owner = pg_server.citus_nodes.index((shard["nodename"], shard["nodeport"]))
    assert owner != 0, "the shard is on the coordinator, not a worker"
    copies = await _copies_on_each_node(pg_server, database_url, execution_id)
    assert copies == {owner: {f"executions_{shard['shardid']}": 1}}

    # The coordinator of this database routes to its own workers' copies of it.
    plan = "\n".join(r[0] for r in await _fetch(
        database_url,
        "EXPLAIN SELECT * FROM executions WHERE bucket = fencepost_bucket($1) "
        "AND execution_id = $1", execution_id))
    database = database_url.rsplit("/", 1)[1]
    assert "Task Count: 1" in plan
    assert f"port={shard['nodeport']} dbname={database}" in plan


async def test_two_test_databases_share_nothing(
        pg_server: TestServer, database_url: str, store: ExecutionStore,
        make_database_url: Callable[[], Awaitable[str]]) -> None:
    await store.admissions.admit(workflow_id="w", params={}, execution_id="only-in-first")
    other_url = await make_database_url()

    assert await _fetch(other_url, "SELECT execution_id FROM executions") == []
    assert await _copies_on_each_node(pg_server, other_url, "only-in-first") == {}
    first = await _copies_on_each_node(pg_server, database_url, "only-in-first")
    assert sum(sum(c.values()) for c in first.values()) == 1


async def test_an_empty_database_is_a_cluster_without_the_schema(
        pg_server: TestServer, empty_database_url: str) -> None:
    nodes = await _fetch(empty_database_url,
                         "SELECT nodename, nodeport FROM pg_dist_node ORDER BY groupid")
    assert [(r["nodename"], r["nodeport"]) for r in nodes] == pg_server.citus_nodes
    database = empty_database_url.rsplit("/", 1)[1]
    for admin_url in pg_server.nodes:
        rows = await _fetch(with_database(admin_url, database),
                            "SELECT to_regclass('executions') AS t, "
                            "(SELECT extname FROM pg_extension WHERE extname = 'citus') AS e")
        assert (rows[0]["t"], rows[0]["e"]) == (None, "citus")
