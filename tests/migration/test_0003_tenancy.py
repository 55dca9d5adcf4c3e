"""Revision 0003 (tenancy) upgrades a database holding data: schedule events
move to their own table (a real execution whose ID starts with `schedule:`
keeps its events), signals keep their rows with no sender, tokens keep theirs
with no quota; and it downgrades with the events moved back."""

from __future__ import annotations

import asyncpg

from app import migrate


async def _seed_0002(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO executions (execution_id, workflow_id, params, status, due_at)
            VALUES ('schedule:looks-like-one', 'w', '{}', 'admitted', now()),
                   ('order-1', 'w', '{}', 'suspended', NULL);
            INSERT INTO execution_events (execution_id, kind, detail) VALUES
                ('schedule:nightly', 'schedule_created', '{"cron": "0 2 * * *"}'),
                ('schedule:nightly', 'schedule_fired', '{"slot": "2026-12-01T02:00:00Z"}'),
                ('schedule:looks-like-one', 'admitted', NULL),
                ('order-1', 'admitted', NULL);
            INSERT INTO signals (execution_id, name, payload) VALUES ('order-1', 'ping', '1');
            INSERT INTO api_tokens (token_id, name, role, secret_sha256)
            VALUES ('abc', 'shop', 'trigger', 'x');
            """
        )
    finally:
        await conn.close()


async def test_0003_upgrades_a_database_holding_data(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0002")
    await _seed_0002(url)

    await migrate.upgrade(url, "0003")

    conn = await asyncpg.connect(url)
    try:
        moved = await conn.fetch(
            "SELECT schedule_id, kind, detail FROM schedule_events ORDER BY event_id")
        assert [(r["schedule_id"], r["kind"]) for r in moved] == [
            ("nightly", "schedule_created"), ("nightly", "schedule_fired")]
        left = await conn.fetch(
            "SELECT execution_id, kind FROM execution_events ORDER BY event_id")
        assert [(r["execution_id"], r["kind"]) for r in left] == [
            ("schedule:looks-like-one", "admitted"), ("order-1", "admitted")]
        signal = await conn.fetchrow("SELECT name, sender_token_id, sender_name FROM signals")
        assert dict(signal) == {"name": "ping", "sender_token_id": None, "sender_name": None}
        token = await conn.fetchrow(
            "SELECT admissions_per_minute, signals_per_minute FROM api_tokens")
        assert dict(token) == {"admissions_per_minute": None, "signals_per_minute": None}
    finally:
        await conn.close()


async def test_0003_downgrades_to_0002_with_the_schedule_events_moved_back(empty_database_url):
    url = empty_database_url
    await migrate.upgrade(url, "0002")
    await _seed_0002(url)
    await migrate.upgrade(url, "0003")

    await migrate.downgrade(url, "0002")

    conn = await asyncpg.connect(url)
    try:
        kinds = await conn.fetch(
            "SELECT kind FROM execution_events WHERE execution_id = 'schedule:nightly' "
            "ORDER BY event_id")
        assert [r["kind"] for r in kinds] == ["schedule_created", "schedule_fired"]
    finally:
        await conn.close()
    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
