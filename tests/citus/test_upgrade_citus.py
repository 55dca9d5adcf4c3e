"""An existing distributed database upgraded in place: `fencepost migrate --citus` on a
Citus database at revision 0011 numbers each execution's events (revision 0012, on the
distributed tables) and makes anew a statement function whose answer's columns changed."""

from __future__ import annotations

import asyncpg
import pytest

from app.citus import distribute
from app.db import create_pool
from app.migrate import upgrade
from app.settings import Settings
from app.store import ExecutionStore
from app.store.on_shard import REGISTRY
from tests.conftest import TestServer
from tests.support.pools import close_pool

pytestmark = pytest.mark.citus


async def test_an_existing_cluster_at_0011_gets_its_events_numbered_in_id_order(
        pg_server: TestServer, empty_database_url: str) -> None:
    url = empty_database_url
    await upgrade(url, "0011")
    await distribute(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO executions (execution_id, bucket, workflow_id, params, status) "
            "SELECT 'old-' || i, fencepost_bucket('old-' || i), 'w', '{}', 'suspended' "
            "FROM generate_series(1, 8) i")
        # IDs as two nodes' ranges gave them: written in another order than their IDs.
        await conn.execute(
            "INSERT INTO execution_events (event_id, execution_id, bucket, kind) "
            "SELECT (CASE WHEN j % 2 = 0 THEN 1 ELSE 2 END)::bigint * 1000 + 10 * i + j, "
            "       'old-' || i, fencepost_bucket('old-' || i), 'k' || j "
            "FROM generate_series(1, 8) i, generate_series(1, 4) j")
        # A statement function as an older release made it: another answer.
        claim = REGISTRY["claim"]
        await conn.execute(f"DROP FUNCTION {claim.signature}")
        await conn.execute(
            f"CREATE FUNCTION {claim.function}(bucket smallint, buckets smallint[], "
            f"{', '.join(f'p{i} {t}' for i, t in enumerate(claim.params))}) "
            "RETURNS TABLE (execution_id text) LANGUAGE sql AS $$ SELECT NULL::text $$")
    finally:
        await conn.close()

    await upgrade(url, citus=True)

    conn = await asyncpg.connect(url)
    try:
        counters = {r["execution_id"]: r["event_seq"] for r in await conn.fetch(
            "SELECT execution_id, event_seq FROM executions")}
        assert counters == {f"old-{i}": 4 for i in range(1, 9)}
        # The claim's function answers its columns again.
        columns = await conn.fetchval(
            "SELECT count(*) FROM pg_proc, unnest(proargmodes) AS m "
            "WHERE oid = $1::regprocedure AND m = 't'", claim.signature)
        assert columns == len(claim.columns)
    finally:
        await conn.close()

    settings = Settings(database_url=url, claim_recheck_seconds=0)
    pool = await create_pool(settings)
    try:
        store = ExecutionStore.from_settings(pool, settings)
        events = await store.history.events("old-3")
        # Numbered 1.. in event ID order (k2, k4 drew the lower range).
        assert [(e["seq"], e["kind"]) for e in events] == [
            (1, "k2"), (2, "k4"), (3, "k1"), (4, "k3")]
        assert await store.operator.request_wake("old-3") is not None
        events = await store.history.events("old-3")
        assert [(e["seq"], e["kind"]) for e in events][-1] == (5, "wake_requested")
    finally:
        await close_pool(pool)
