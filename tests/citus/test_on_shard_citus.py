"""Step writes and lease renewals on Citus run on the shard that owns them
(app/store/on_shard.py): each OnShard call is delegated to the one node holding its bucket's shard
(EXPLAIN), a call carrying rows of a bucket on another shard (a placement
read before a split) is refused, a write is fenced there (a stale token refused, with its event),
a batch over many shards is answered write by write in order, and the fence
is atomic on the shard: a write waiting for the row while a takeover bumps
the token is refused once the row is free. A renewal over many shards renews
the current leases, loses the stale ones and skips rows held elsewhere."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import bucket_of
from app.store.on_shard import REGISTRY
from app.store.types import Lease, LeaseLost
from tests.conftest import TestServer

pytestmark = pytest.mark.citus


async def _running(database_url: str, ids: list[str], token: int = 1) -> None:
    """Executions already running under `token` (what a claim leaves)."""
    conn = await asyncpg.connect(database_url)
    try:
        for eid in ids:
            await conn.execute(
                "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, "
                "status, token, lease_owner, lease_expires_at) "
                "VALUES ($1, fencepost_bucket($1), 'wf', 'null', '{}', 'running', $2, 'w', "
                "now() + interval '1 hour')", eid, token)
    finally:
        await conn.close()


async def test_each_on_shard_call_is_delegated_to_its_bucket_node(
        pg_server: TestServer, database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for statement in REGISTRY.values():
            for bucket in (0, 77, 255):
                owner = await conn.fetchrow(
                    "SELECT p.nodename, p.nodeport FROM pg_dist_shard_placement p "
                    "WHERE p.shardid = get_shard_id_for_distribution_column("
                    "'executions', $1::smallint)", bucket)
                nulls = ", ".join(f"NULL::{t}" for t in statement.params)
                plan = "\n".join(r[0] for r in await conn.fetch(
                    f"EXPLAIN SELECT * FROM {statement.function}({bucket}::smallint, "
                    f"ARRAY[{bucket}]::smallint[], {nulls})"))
                assert "Task Count: 1" in plan, (statement.name, plan)
                assert f"port={owner['nodeport']} " in plan, (statement.name, plan)
                assert f"Function Scan on {statement.function}" in plan, plan
    finally:
        await conn.close()


async def test_step_writes_are_fenced_on_the_shard(database_url: str,
                                                   store: ExecutionStore) -> None:
    await _running(database_url, ["w-1"], token=3)
    record = await store.steps.write_step(Lease("w-1", 3, None, "w"), "a", value={"n": 1})
    assert record.value == {"n": 1} and record.token == 3
    again = await store.steps.write_step(Lease("w-1", 3, None, "w"), "a", value={"n": 2})
    assert again.value == {"n": 1}  # the first write of a key stands
    with pytest.raises(LeaseLost):
        await store.steps.write_step(Lease("w-1", 2, None, "w"), "b", value=1)
    conn = await asyncpg.connect(database_url)
    try:
        kinds = [r["kind"] for r in await conn.fetch(
            "SELECT kind FROM execution_events WHERE bucket = fencepost_bucket($1) "
            "AND execution_id = $1 ORDER BY event_id", "w-1")]
        steps = await conn.fetch(
            "SELECT step_key, token FROM execution_steps WHERE bucket = fencepost_bucket($1) "
            "AND execution_id = $1", "w-1")
    finally:
        await conn.close()
    assert kinds == ["step_recorded", "fenced_write_rejected"]
    assert [(r["step_key"], r["token"]) for r in steps] == [("a", 3)]


async def test_a_batch_over_many_shards_is_answered_in_order(database_url: str,
                                                             store: ExecutionStore) -> None:
    ids = [f"many-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    await _running(database_url, ids, token=1)
    leases = [Lease(eid, 1 if i % 7 else 0, None, "w") for i, eid in enumerate(ids)]
    results = await asyncio.gather(
        *(store.steps.write_step(lease, "s", value=i) for i, lease in enumerate(leases)),
        return_exceptions=True)
    for i, result in enumerate(results):
        if i % 7:
            assert not isinstance(result, BaseException) and result.value == i, (i, result)
        else:
            assert isinstance(result, LeaseLost), (i, result)
    assert store.steps.step_writes is not None and store.steps.step_writes.batches < len(ids)


async def test_a_write_waiting_for_the_row_is_refused_after_a_takeover(
        database_url: str, store: ExecutionStore) -> None:
    await _running(database_url, ["held"], token=1)
    holder = await asyncpg.connect(database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        # A takeover in progress: the row locked, the token bumped, not committed.
        await holder.execute(
            "UPDATE executions SET token = token + 1 WHERE bucket = fencepost_bucket($1) "
            "AND execution_id = $1", "held")
        write = asyncio.ensure_future(
            store.steps.write_step(Lease("held", 1, None, "w"), "late", value=1))
        await asyncio.sleep(0.5)
        assert not write.done(), "the write did not wait for the row"
        await tx.commit()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(write, 30)
    finally:
        await holder.close()
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval(
            "SELECT count(*) FROM execution_steps WHERE bucket = fencepost_bucket($1) "
            "AND execution_id = $1", "held") == 0
    finally:
        await conn.close()


async def test_rows_sent_to_the_wrong_shard_are_refused(database_url: str,
                                                        store: ExecutionStore) -> None:
    await _running(database_url, ["wrong-1"], token=1)
    conn = await asyncpg.connect(database_url)
    try:
        other = await conn.fetchval(
            "SELECT b FROM generate_series(0, 255) b WHERE get_shard_id_for_distribution_column("
            "'executions', b::smallint) <> get_shard_id_for_distribution_column('executions', $1::smallint)"
            " LIMIT 1", bucket_of("wrong-1"))
    finally:
        await conn.close()
    args = (["wrong-1"], [1], ["a"], ["completed"], ["1"], [None], [None], [1], [0])
    with pytest.raises(asyncpg.PostgresError, match="not all on the shard"):
        await REGISTRY["write_steps"].fetch(store.pool, [other, bucket_of("wrong-1")], *args)
    assert await store.pool.fetchval(
        "SELECT count(*) FROM execution_steps WHERE bucket = fencepost_bucket($1) "
        "AND execution_id = $1", "wrong-1") == 0


async def test_renewals_over_many_shards_renew_the_current_leases_alone(
        database_url: str, store: ExecutionStore) -> None:
    """One renewal of a worker's leases in many shards: each current lease is
    extended on its shard, a stale one is lost (with its event), and one whose
    row another transaction holds is neither (tried again next round)."""
    ids = [f"renew-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    await _running(database_url, ids, token=2)
    leases = [Lease(eid, 1 if i % 7 == 0 else 2, None, "w") for i, eid in enumerate(ids)]
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("UPDATE executions SET lease_expires_at = now() + interval '1 minute' "
                             "WHERE execution_id = ANY($1::text[])", ids)
        tx = holder.transaction()
        await tx.start()
        # A transactional step of renew-1 in progress: its row is locked.
        await holder.execute(
            "UPDATE executions SET updated_at = now() WHERE bucket = fencepost_bucket($1) "
            "AND execution_id = $1", "renew-1")
        renewed, lost, interrupts = await store.leases.renew_with_interrupts(leases, 600)
        await tx.rollback()
    finally:
        await holder.close()
    assert sorted(lease.execution_id for lease in lost) == sorted(ids[::7])
    assert sorted(lease.execution_id for lease in renewed) == sorted(
        eid for i, eid in enumerate(ids) if i % 7 and eid != "renew-1")
    assert interrupts == {}
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT execution_id, lease_expires_at > now() + interval '5 minutes' AS extended "
            "FROM executions WHERE execution_id = ANY($1::text[])", ids)
        lost_events = await conn.fetch(
            "SELECT execution_id, token FROM execution_events WHERE kind = 'renewal_lost'")
    finally:
        await conn.close()
    assert sorted(r["execution_id"] for r in rows if r["extended"]) == sorted(
        lease.execution_id for lease in renewed)
    assert sorted((r["execution_id"], r["token"]) for r in lost_events) == sorted(
        (eid, 1) for eid in ids[::7])
