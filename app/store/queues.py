"""Queues: their declared and run-time settings. The limits themselves are
enforced where executions are claimed (Leases.claim_due)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from typing import Any

from app.store.handle import StoreObject
from app.store.records import QueueChangeRecord, QueueCounts, QueueSettings, record, records

# The lock on the queues' settings (fencepost_claim_limits, revision 0008):
# every claim holds it shared; a change of settings takes it exclusively, so
# it waits for the claims in flight and every later claim reads the change.
_LOCK_SETTINGS = "SELECT pg_advisory_xact_lock(1179665746, 0)"


class Queues(StoreObject):
    async def declare(self, declared: dict[str, dict[str, Any]]) -> None:
        """Record what code declares for each queue (name -> settings). An
        operator's run-time settings keep winning; a declaration that
        differs from the stored one is recorded as a change by `code`."""
        if not declared:
            return
        names = sorted(declared)

        async def run(db: Any) -> None:
            await db.execute(_LOCK_SETTINGS)
            await db.execute(
                """
                WITH d AS (
                    SELECT name, settings FROM unnest($1::text[], $2::jsonb[]) AS d(name, settings)
                ), up AS (
                    -- The time is the inserted row's: Citus refuses now() in
                    -- ON CONFLICT DO UPDATE (queues is a reference table).
                    INSERT INTO queues AS q (name, declared, updated_at)
                    SELECT name, settings, now() FROM d
                    ON CONFLICT (name) DO UPDATE
                    SET declared = excluded.declared, updated_at = excluded.updated_at
                    WHERE q.declared IS DISTINCT FROM excluded.declared
                    RETURNING q.name, q.declared
                )
                INSERT INTO queue_changes (queue, actor, change)
                SELECT name, 'code', jsonb_build_object('declared', declared) FROM up
                """,
                names,
                [declared[n] for n in names],
            )
        await self.db.run_in_transaction(run)

    async def change(self, name: str, settings: dict[str, Any], *, actor: str | None,
                     reset: list[str] | None = None) -> QueueSettings:
        """Set run-time settings (they win over the declared ones; a None
        value means "no limit"), and drop the run-time value of each setting
        in `reset` (the declared one applies again). Recorded as a change.
        Returns the queue's settings after the change."""
        async def run(db: Any) -> QueueSettings:
            await db.execute(_LOCK_SETTINGS)
            row = await db.fetchrow(
                """
                WITH up AS (
                    INSERT INTO queues AS q (name, override, updated_at)
                    VALUES ($1, $2::jsonb, now())
                    ON CONFLICT (name) DO UPDATE
                    SET override = (q.override - $3::text[]) || excluded.override,
                        updated_at = excluded.updated_at
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

    async def get(self, name: str) -> QueueSettings | None:
        """One queue's declared, run-time and effective settings, or None."""
        row = await self.db.fetchrow(_SETTINGS + " WHERE q.name = $1", name)
        return _settings_row(row) if row is not None else None

    async def list(self) -> list[QueueSettings]:
        rows = await self.db.fetch(_SETTINGS + " ORDER BY q.name")
        return [_settings_row(r) for r in rows]

    async def counts(self, names: Sequence[str] | None = None) -> dict[str, QueueCounts]:
        """Per queue (all, or those named): `running` (executions holding a
        slot), `due` (waiting to be claimed) and `starts_in_period` (starts
        within the rate period; None without a rate limit)."""
        rows = await self.db.fetch(
            _COUNTS,
            None if names is None else builtins.list(names))
        return {r["name"]: {"running": r["running"], "due": r["due"],
                            "starts_in_period": r["starts_in_period"]} for r in rows}

    async def changes(self, name: str, limit: int = 20) -> builtins.list[QueueChangeRecord]:
        """The queue's newest changes first: at, actor (`code` for a changed
        declaration) and what changed."""
        rows = await self.db.fetch(
            "SELECT change_id, at, actor, change FROM queue_changes WHERE queue = $1 "
            "ORDER BY change_id DESC LIMIT $2", name, limit)
        changes = records(QueueChangeRecord, rows)
        for c, r in zip(changes, rows, strict=True):
            if isinstance(r["change"], str):
                c["change"] = json.loads(r["change"])
        return changes

    async def _one(self, db: Any, name: str) -> QueueSettings:
        row = await db.fetchrow(_SETTINGS + " WHERE q.name = $1", name)
        return _settings_row(row)


_SETTINGS = """
    SELECT q.name, q.declared, q.override, q.updated_at, s.concurrency, s.per_key_concurrency,
           s.rate_limit, s.rate_period, s.rate_per_key, s.hold_while_suspended, s.paused
    FROM queues q JOIN queue_settings s ON s.name = q.name
"""


def _settings_row(row: Any) -> QueueSettings:
    out = record(QueueSettings, row)
    if isinstance(row["declared"], str):
        out["declared"] = json.loads(row["declared"])
    if isinstance(row["override"], str):
        out["override"] = json.loads(row["override"])
    return out


# What holds a slot of a queue, as the claim counts it (fencepost_claim_limits):
# a running execution with an unexpired lease, and a suspended one when the
# queue holds slots while suspended.
_COUNTS = """
    -- Citus: counts over executions of every bucket (multi-shard), grouped
    -- by queue first (a subquery correlated with the settings, a reference
    -- table, cannot be pushed down)
    SELECT s.name,
           (coalesce(c.running, 0)
            + CASE WHEN s.hold_while_suspended THEN coalesce(c.suspended, 0) ELSE 0 END
           )::integer AS running,
           coalesce(c.due, 0)::integer AS due,
           CASE WHEN s.rate_limit IS NOT NULL THEN
               (SELECT count(*) FROM queue_starts st
                WHERE st.queue = s.name
                  AND st.started_at > now() - make_interval(secs => s.rate_period))::integer
           END AS starts_in_period
    FROM queue_settings s
    LEFT JOIN (
        SELECT e.queue,
               count(*) FILTER (WHERE e.status = 'running'
                                  AND e.lease_expires_at > now()) AS running,
               count(*) FILTER (WHERE e.status = 'suspended') AS suspended,
               count(*) FILTER (WHERE e.status IN ('admitted', 'suspended')
                                  AND e.due_at <= now()) AS due
        FROM executions e
        WHERE e.status IN ('admitted', 'running', 'suspended')
          AND ($1::text[] IS NULL OR e.queue = ANY($1::text[]))
        GROUP BY e.queue
    ) c ON c.queue = s.name
    WHERE $1::text[] IS NULL OR s.name = ANY($1::text[])
"""

