"""Revision 0011 (claim limits counted apart) upgrades a database holding
data: `fencepost_claim_limits` answers what revision 0008's function answered
for every queue a claim locks (slots, keys, starts), and only a limited queue
closed to the claim no longer has its counts read; the downgrade brings the
old function back, answering as before."""

from __future__ import annotations

import asyncpg

from app import migrate

_DATA = """
INSERT INTO queues (name, override) VALUES
    ('busy', '{"concurrency": 3, "per_key_concurrency": 1, "rate_limit": 5,
               "rate_period": 3600, "rate_per_key": true}'),
    ('capped', '{"concurrency": 2, "rate_limit": 4, "rate_period": 3600}'),
    ('idle', '{"concurrency": 2}');
INSERT INTO executions (execution_id, bucket, workflow_id, params, status, token, queue,
                        concurrency_key, due_at, lease_owner, lease_expires_at)
SELECT 'b' || i, fencepost_bucket('b' || i), 'w', '{}',
       CASE WHEN i < 2 THEN 'running' ELSE 'admitted' END, CASE WHEN i < 2 THEN 1 ELSE 0 END,
       'busy', 'k' || (i % 2), CASE WHEN i >= 2 THEN now() END,
       CASE WHEN i < 2 THEN 'w' END, CASE WHEN i < 2 THEN now() + interval '1 hour' END
FROM generate_series(0, 4) i;
INSERT INTO executions (execution_id, bucket, workflow_id, params, status, token, queue,
                        due_at, lease_owner, lease_expires_at)
VALUES ('c0', fencepost_bucket('c0'), 'w', '{}', 'running', 1, 'capped', NULL, 'w',
        now() + interval '1 hour'),
       ('c1', fencepost_bucket('c1'), 'w', '{}', 'admitted', 0, 'capped', now(), NULL, NULL),
       -- Held, but nothing of 'idle' is due: closed to a claim.
       ('i0', fencepost_bucket('i0'), 'w', '{}', 'running', 1, 'idle', NULL, 'w',
        now() + interval '1 hour');
INSERT INTO queue_starts (queue, concurrency_key, started_at) VALUES
    ('busy', 'k1', now()), ('busy', 'k0', now() - interval '2 hours'), ('capped', NULL, now());
"""


async def _limits(url: str) -> set[tuple]:
    conn = await asyncpg.connect(url)
    try:
        return {tuple(r) for r in await conn.fetch("SELECT * FROM fencepost_claim_limits(NULL)")}
    finally:
        await conn.close()


async def test_0011_answers_the_same_limits_on_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0010")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_DATA)
    finally:
        await conn.close()
    before = await _limits(url)
    # (queue, key, is_key, closed, run_free, start_free, hold, key_run_limit, key_start_limit)
    assert ("busy", None, False, False, 1, None, False, 1, 5) in before
    assert ("busy", "k0", True, False, 0, 5, False, 1, 5) in before
    assert ("busy", "k1", True, False, 0, 4, False, 1, 5) in before
    assert ("capped", None, False, False, 1, 3, False, None, None) in before
    assert ("idle", None, False, True, 1, None, False, None, None) in before

    await migrate.upgrade(url, "0011")
    after = await _limits(url)
    # The same, but the closed queue's slots are no longer counted.
    assert after == (before - {("idle", None, False, True, 1, None, False, None, None)}) | {
        ("idle", None, False, True, None, None, False, None, None)}

    await migrate.downgrade(url, "0010")
    assert await _limits(url) == before
