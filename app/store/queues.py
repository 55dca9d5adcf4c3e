"""Queues: their declared and run-time settings. The limits themselves are
enforced where executions are claimed (Leases.claim_due)."""

from __future__ import annotations

import json
from typing import Any

from app.store.handle import StoreObject

# The lock a claim takes on each queue (fencepost_claim_limits, revision
# 0008): a change of settings takes it exclusively, so it waits for the
# claims in flight and every later claim reads the new settings.
_LOCK_QUEUE = "SELECT pg_advisory_xact_lock(1179665745, hashtext($1))"


class Queues(StoreObject):
    async def declare(self, declared: dict[str, dict[str, Any]]) -> None:
        """Record what code declares for each queue (name -> settings). An
        operator's run-time settings keep winning; a declaration that
        differs from the stored one is recorded as a change by `code`."""
        if not declared:
            return
        names = sorted(declared)
        await self.db.execute(
            """
            WITH d AS (
                SELECT name, settings FROM unnest($1::text[], $2::jsonb[]) AS d(name, settings)
            ), up AS (
                INSERT INTO queues AS q (name, declared)
                SELECT name, settings FROM d
                ON CONFLICT (name) DO UPDATE SET declared = excluded.declared, updated_at = now()
                WHERE q.declared IS DISTINCT FROM excluded.declared
                RETURNING q.name, q.declared
            )
            INSERT INTO queue_changes (queue, actor, change)
            SELECT name, 'code', jsonb_build_object('declared', declared) FROM up
            """,
            names,
            [declared[n] for n in names],
        )

    async def change(self, name: str, settings: dict[str, Any], *, actor: str | None,
                     reset: list[str] | None = None) -> dict[str, Any]:
        """Set run-time settings (they win over the declared ones; a None
        value means "no limit"), and drop the run-time value of each setting
        in `reset` (the declared one applies again). Recorded as a change.
        Returns the queue's settings after the change."""
        async def run(db: Any) -> dict[str, Any]:
            await db.execute(_LOCK_QUEUE, name)
            row = await db.fetchrow(
                """
                WITH up AS (
                    INSERT INTO queues AS q (name, override) VALUES ($1, $2::jsonb)
                    ON CONFLICT (name) DO UPDATE
                    SET override = (q.override - $3::text[]) || excluded.override,
                        updated_at = now()
                    RETURNING q.name
                ), ch AS (
                    INSERT INTO queue_changes (queue, actor, change)
                    SELECT name, $4, jsonb_build_object('set', $2::jsonb, 'reset', to_jsonb($3::text[]))
                    FROM up
                )
                SELECT name FROM up
                """,
                name,
                settings,
                reset or [],
                actor,
            )
            assert row is not None
            return await self._one(db, name)
        return await self.db.run_in_transaction(run)

    async def get(self, name: str) -> dict[str, Any] | None:
        """One queue's declared, run-time and effective settings, or None."""
        row = await self.db.fetchrow(_SETTINGS + " WHERE q.name = $1", name)
        return _settings_row(row) if row is not None else None

    async def list(self) -> list[dict[str, Any]]:
        rows = await self.db.fetch(_SETTINGS + " ORDER BY q.name")
        return [_settings_row(r) for r in rows]

    async def _one(self, db: Any, name: str) -> dict[str, Any]:
        row = await db.fetchrow(_SETTINGS + " WHERE q.name = $1", name)
        return _settings_row(row)


_SETTINGS = """
    SELECT q.name, q.declared, q.override, q.updated_at, s.concurrency, s.per_key_concurrency,
           s.rate_limit, s.rate_period, s.rate_per_key, s.hold_while_suspended, s.paused
    FROM queues q JOIN queue_settings s ON s.name = q.name
"""


def _settings_row(row: Any) -> dict[str, Any]:
    out = dict(row)
    for key in ("declared", "override"):
        if isinstance(out[key], str):
            out[key] = json.loads(out[key])
    return out
