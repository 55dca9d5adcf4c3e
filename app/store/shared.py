"""Settings every process must agree on (the poison threshold, the lease, the
redelivery delays), stored once in `shared_settings`. The first api or worker
process to start stores its values; every later one compares its own with the
stored ones at start and refuses to run on a difference (app/shared_settings.py).
A deliberate change goes through `fencepost settings set`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.store.handle import StoreObject


@dataclass(frozen=True)
class StoredSetting:
    value: Any
    updated_at: datetime


@dataclass(frozen=True)
class SettingChange:
    value: Any
    updated_at: datetime
    previous: Any  # None: nothing was stored before


class SharedSettings(StoreObject):
    async def store_shared_settings(self, values: dict[str, Any]) -> dict[str, StoredSetting]:
        """Store each of `values` not stored yet and return what is stored for
        each name. The first writer wins:
        an existing value is never overwritten here, so two processes started
        at once with different values cannot both win."""
        for _ in range(3):
            rows = await self.db.fetch(
                """
                WITH given AS (
                    SELECT key AS name, value FROM jsonb_each($1::jsonb)
                ), ins AS (
                    -- Only a name nobody stored: a stored value changes only by
                    -- set_shared_setting (a deliberate operator decision).
                    INSERT INTO shared_settings (name, value)
                    SELECT name, value FROM given
                    ON CONFLICT (name) DO NOTHING
                    RETURNING name, value, updated_at
                )
                SELECT name, value, updated_at FROM ins
                UNION ALL
                SELECT s.name, s.value, s.updated_at
                FROM shared_settings s JOIN given g ON g.name = s.name
                WHERE s.name NOT IN (SELECT name FROM ins)
                """,
                values,
            )
            stored = {r["name"]: StoredSetting(r["value"], r["updated_at"]) for r in rows}
            # A row another process inserted after this statement's snapshot
            # was neither inserted nor seen: the next statement sees it.
            if set(stored) >= set(values):
                return stored
        raise RuntimeError("shared settings: stored rows neither inserted nor visible, 3 times")

    async def shared_settings(self) -> dict[str, StoredSetting]:
        """Every stored shared setting, by name."""
        rows = await self.db.fetch("SELECT name, value, updated_at FROM shared_settings")
        return {r["name"]: StoredSetting(r["value"], r["updated_at"]) for r in rows}

    async def set_shared_setting(self, name: str, value: Any) -> SettingChange:
        """Store `value` for `name` whatever was stored (the operator's
        deliberate change)."""
        row = await self.db.fetchrow(
            """
            WITH old AS (SELECT value FROM shared_settings WHERE name = $1),
            up AS (
                -- The time is the inserted row's: Citus refuses now() in ON
                -- CONFLICT DO UPDATE (shared_settings is a reference table).
                INSERT INTO shared_settings (name, value, updated_at) VALUES ($1, $2::jsonb, now())
                ON CONFLICT (name) DO UPDATE
                SET value = excluded.value, updated_at = excluded.updated_at
                RETURNING value, updated_at
            )
            SELECT up.value, up.updated_at, (SELECT value FROM old) AS previous FROM up
            """,
            name, value,
        )
        assert row is not None  # the upsert always returns its row
        return SettingChange(row["value"], row["updated_at"], row["previous"])
