"""Maintenance leases: which worker runs a maintenance role right now.

A role's lease is one row of `maintenance_leases`: holder, fencing token and
an expiry on the database clock. The holder renews it before it expires;
once it has expired anyone may take it, and a change of holder (or a new
term of the same holder after an expiry) increments the token. A holder is
the leader only while its (holder, token) is the row's and the expiry is in
the future: a process that was paused past the expiry learns from `holds`
that its term is over, even though its connection stayed open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.store.handle import StoreObject


@dataclass(frozen=True)
class MaintenanceLease:
    role: str
    holder: str
    token: int
    expires_at: datetime


class MaintenanceLeases(StoreObject):
    """Each maintenance role's lease (store.maintenance)."""

    async def acquire(self, role: str, holder: str, ttl_seconds: float) -> MaintenanceLease | None:
        """Take or renew `role` for `holder` until now + ttl: renewed (same
        token) while `holder`'s term is unexpired, taken (token + 1) when the
        lease has expired or never existed; None while another holder's
        unexpired lease stands. The row lock of the upsert serialises
        concurrent takeovers: exactly one of them finds the lease expired."""
        row = await self.db.fetchrow(
            """
            -- The time is the inserted row's (excluded.renewed_at, now()):
            -- Citus refuses now() in ON CONFLICT DO UPDATE (a reference table).
            INSERT INTO maintenance_leases AS m
                (role, holder, token, acquired_at, renewed_at, expires_at)
            VALUES ($1, $2, 1, now(), now(), now() + make_interval(secs => $3::float8))
            ON CONFLICT (role) DO UPDATE
            SET holder = excluded.holder,
                token = CASE WHEN m.holder = excluded.holder AND m.expires_at > excluded.renewed_at
                             THEN m.token ELSE m.token + 1 END,
                acquired_at = CASE WHEN m.holder = excluded.holder
                                        AND m.expires_at > excluded.renewed_at
                                   THEN m.acquired_at ELSE excluded.acquired_at END,
                renewed_at = excluded.renewed_at,
                expires_at = excluded.expires_at
            WHERE m.holder = excluded.holder OR m.expires_at <= excluded.renewed_at
            RETURNING role, holder, token, expires_at
            """,
            role, holder, ttl_seconds,
        )
        return MaintenanceLease(**dict(row)) if row is not None else None

    async def holds(self, lease: MaintenanceLease) -> bool:
        """Whether `lease`'s term still stands: same holder and token, not expired."""
        return bool(await self.db.fetchval(
            "SELECT true FROM maintenance_leases "
            "WHERE role = $1 AND holder = $2 AND token = $3 AND expires_at > now()",
            lease.role, lease.holder, lease.token,
        ))

    async def release(self, lease: MaintenanceLease) -> bool:
        """End `lease`'s term now (a stopping leader), so another worker takes
        the role at its next attempt instead of after the expiry."""
        return bool(await self.db.fetchval(
            "UPDATE maintenance_leases SET expires_at = now() "
            "WHERE role = $1 AND holder = $2 AND token = $3 AND expires_at > now() "
            "RETURNING true",
            lease.role, lease.holder, lease.token,
        ))

    async def leaders(self) -> list[MaintenanceLease]:
        """Every role's current, unexpired holder."""
        rows = await self.db.fetch(
            "SELECT role, holder, token, expires_at FROM maintenance_leases "
            "WHERE expires_at > now() ORDER BY role")
        return [MaintenanceLease(**dict(r)) for r in rows]
