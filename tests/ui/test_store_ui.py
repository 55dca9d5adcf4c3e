"""The dashboard's reads (app/store/ui.py) against real Postgres: blockedBy
computed in SQL agrees with app/blocked.py, the filters, sorts and counts,
and the per-minute activity (with its primary-key bisection)."""

from __future__ import annotations

from datetime import timedelta

from app.blocked import blocked_by
from app.store import ExecutionStore
from tests.support.admission import admit


async def _claim(store: ExecutionStore, workflow_id: str):
    [delivery] = await store.leases.claim_due(1, 30, "worker-x", [workflow_id])
    return delivery.lease


async def _every_state(store: ExecutionStore) -> dict[str, str]:
    """One execution per blockedBy reason: {execution_id: reason}."""
    pool = store.pool
    await admit(store, "w-live", "due-1")
    await admit(store, "w-dead", "noworker-1")
    await admit(store, "w-live-sleep", "sleep-1")
    await pool.execute("UPDATE executions SET status = 'suspended', ever_suspended = true, "
                       "due_at = now() + interval '1 hour', waiting_on = '{\"sleep\": \"nap\"}' "
                       "WHERE execution_id = 'sleep-1'")
    await admit(store, "w-live-signal", "signal-1")
    await pool.execute("UPDATE executions SET status = 'suspended', ever_suspended = true, "
                       "due_at = NULL, waiting_on = '{\"signal\": \"approval\"}' "
                       "WHERE execution_id = 'signal-1'")
    await admit(store, "w-leased", "leased-1")
    await _claim(store, "w-leased")
    await admit(store, "w-expired", "expired-1")
    await _claim(store, "w-expired")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = 'expired-1'")
    await admit(store, "w-delay", "delay-1")
    await store.operator.request_wake("delay-1")
    await store.leases.release(await _claim(store, "w-delay"))
    await store.operator.request_wake("delay-1")
    await admit(store, "w-parked", "parked-1")
    await pool.execute("UPDATE executions SET status = 'parked', parked_reason = 'poison', "
                       "due_at = NULL WHERE execution_id = 'parked-1'")
    await admit(store, "w-done", "done-1")
    await store.leases.acknowledge(await _claim(store, "w-done"), "completed", result={"ok": True})
    return {
        "due-1": "due", "noworker-1": "no-worker", "sleep-1": "sleeping",
        "signal-1": "waiting-for-signal", "leased-1": "leased", "expired-1": "lease-expired",
        "delay-1": "redelivery-delay", "parked-1": "parked", "done-1": "none",
    }


LIVE = {"w-live", "w-live-sleep", "w-live-signal", "w-leased", "w-expired", "w-delay",
        "w-parked", "w-done"}


async def test_blocked_reason_in_sql_agrees_with_app_blocked(store):
    expected = await _every_state(store)
    rows, total = await store.dashboard.ui_list(live_workflows=LIVE, limit=100)
    assert total == len(expected)
    for row in rows:
        python = blocked_by(row, LIVE)
        assert row["blocked_reason"] == (python["reason"] if python else "none"), row
        assert row["blocked_reason"] == expected[row["execution_id"]]
    for eid, reason in expected.items():
        found, n = await store.dashboard.ui_list(live_workflows=LIVE, blocked_by=reason)
        assert [r["execution_id"] for r in found] == [eid] and n == 1, reason


async def test_filters_sorts_counts_and_pages(store):
    for i in range(7):
        await admit(store, "w-a" if i % 2 else "w-b", f"e-{i}")
        await store.pool.execute(
            "UPDATE executions SET unacknowledged_deliveries = $2, "
            "admitted_at = now() - make_interval(mins => $3) WHERE execution_id = $1",
            f"e-{i}", i, 70 - i)
    rows, total = await store.dashboard.ui_list(live_workflows=set(), min_unacknowledged_deliveries=4,
                                      sort="unacked-desc")
    assert [r["execution_id"] for r in rows] == ["e-6", "e-5", "e-4"] and total == 3
    rows, total = await store.dashboard.ui_list(live_workflows=set(), workflow_id="w-a",
                                      sort="admitted-asc")
    assert [r["execution_id"] for r in rows] == ["e-1", "e-3", "e-5"]
    now = await store.clock.db_now()
    rows, total = await store.dashboard.ui_list(live_workflows=set(),
                                      admitted_from=now - timedelta(minutes=68.5),
                                      admitted_to=now - timedelta(minutes=65.5))
    assert [r["execution_id"] for r in rows] == ["e-4", "e-3", "e-2"]
    page2, total = await store.dashboard.ui_list(live_workflows=set(), limit=3, offset=3)
    assert [r["execution_id"] for r in page2] == ["e-3", "e-2", "e-1"] and total == 7
    assert await store.dashboard.status_counts() == {"admitted": 7}
    assert await store.dashboard.workflow_ids_seen() == ["w-a", "w-b"]


async def test_status_counts_are_healed(store):
    await admit(store, "w", "x-1")
    await _claim(store, "w")
    assert await store.dashboard.status_counts() == {"running": 1}
    await store.pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 s'")
    assert await store.dashboard.status_counts() == {"admitted": 1}
    assert await store.dashboard.leases_by_owner() == {}


async def test_activity_per_minute(store):
    pool = store.pool
    # Old history first (lower event IDs), then the last hour.
    await pool.execute(
        "INSERT INTO execution_events (execution_id, bucket, kind, detail, at, seq) "
        "SELECT 'x', fencepost_bucket('x'), 'acknowledged', '{\"status\": \"completed\"}', "
        "now() - interval '3 hours', g FROM generate_series(1, 2000) g")
    await pool.execute(
        """
        INSERT INTO execution_events (execution_id, bucket, kind, detail, at, seq)
        SELECT e.execution_id, fencepost_bucket(e.execution_id), e.kind, e.detail, e.at,
               2000 + row_number() OVER () FROM (
        SELECT 'x' AS execution_id, 'acknowledged' AS kind,
               '{"status": "completed"}'::jsonb AS detail, date_trunc('minute', now()) AS at
        FROM generate_series(1, 3)
        UNION ALL SELECT 'x', 'acknowledged', '{"status": "failed"}',
                         date_trunc('minute', now()) - interval '10 minutes'
        UNION ALL SELECT 'x', 'acknowledged', '{"status": "timed_out"}',
                         date_trunc('minute', now()) - interval '10 minutes'
        UNION ALL SELECT 'x', 'acknowledged', '{"status": "suspended"}', now()
        UNION ALL SELECT 'x', 'released', '{}', date_trunc('minute', now()) - interval '59 minutes'
        UNION ALL SELECT 'x', 'lease_expired', '{}', date_trunc('minute', now()) - interval '30 minutes'
        UNION ALL SELECT 'x', 'released', '{}', now() - interval '61 minutes') e
        """)
    now, rows = await store.dashboard.activity_per_minute(60)
    assert len(rows) == 60
    assert rows[-1]["completed"] == 3
    assert rows[-11]["failed"] == 2
    assert rows[0]["unacknowledged"] == 1 and rows[-31]["unacknowledged"] == 1
    assert sum(r["completed"] for r in rows) == 3
    assert sum(r["unacknowledged"] for r in rows) == 2
    # The bisection bound skips the old history but nothing of the last hour.
    async with pool.acquire() as conn:
        since = rows[0]["minute"]
        first = await store.dashboard._first_event_id_at(conn, since)
        oldest_recent = await conn.fetchval(
            "SELECT min(event_id) FROM execution_events WHERE at >= $1", since)
        old_last = await conn.fetchval(
            "SELECT max(event_id) FROM execution_events WHERE at < now() - interval '2 hours'")
        assert old_last < first <= oldest_recent


async def test_activity_with_no_events(store):
    _, rows = await store.dashboard.activity_per_minute(60)
    assert len(rows) == 60 and not any(r["completed"] or r["failed"] or r["unacknowledged"]
                                       for r in rows)
