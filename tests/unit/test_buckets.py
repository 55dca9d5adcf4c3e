"""An execution's bucket as the application computes it (app.store.buckets)
equals the database's fencepost_bucket(), for any ID an execution may have."""

import random

import asyncpg

from app.store.buckets import BUCKETS, bucket_of


async def test_python_and_sql_buckets_agree(database_url):
    rng = random.Random(21)
    ids = ["", "a", "order-1", "ünïcødé-🚀", "x" * 255, "tenant/42:2026-12-02T10:00:00Z"]
    alphabet = "abcXYZ019-_:/.é漢🙂"
    ids += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT i, fencepost_bucket(i) AS b FROM unnest($1::text[]) AS i", ids)
    finally:
        await conn.close()
    assert [r["b"] for r in rows] == [bucket_of(i) for i in ids]
    # The hash spreads: every bucket used by 3,000 random IDs, none by more than 3x its share.
    seen = [bucket_of(i) for i in ids]
    assert set(seen) == set(range(BUCKETS))
    assert max(seen.count(b) for b in range(BUCKETS)) < 3 * len(ids) / BUCKETS
