"""API tokens: created, listed, revoked, looked up. Only a SHA-256 of the
secret is stored; tokens are 256-bit random, so a fast hash is enough.

Quotas (`admissions_per_minute`, `signals_per_minute`; NULL = no limit) live
on the token row but are never written per request: each API process reads
them with `token_quotas()` every few seconds and counts in memory
(app/api/quotas.py), so a shared token's admissions take no lock on its row.
"""

from __future__ import annotations

from app.store.handle import StoreObject
from app.store.records import TokenRecord, TokenSecret, record, records

# A quota change: a positive limit, None to remove it, or UNCHANGED.
UNCHANGED = object()


class Tokens(StoreObject):
    async def create_token(self, token_id: str, *, name: str, role: str, secret_sha256: str,
                           admissions_per_minute: int | None = None,
                           signals_per_minute: int | None = None) -> None:
        # The check constraint quotas_positive refuses a limit of 0 or less.
        await self.db.execute(
            "INSERT INTO api_tokens (token_id, name, role, secret_sha256, "
            "admissions_per_minute, signals_per_minute) VALUES ($1, $2, $3, $4, $5, $6)",
            token_id, name, role, secret_sha256, admissions_per_minute, signals_per_minute,
        )

    async def list_tokens(self) -> list[TokenRecord]:
        rows = await self.db.fetch(
            "SELECT token_id, name, role, created_at, revoked_at, admissions_per_minute, "
            "signals_per_minute FROM api_tokens ORDER BY created_at"
        )
        return records(TokenRecord, rows)

    async def revoke_token(self, token_id_or_name: str) -> int:
        """Revoke by ID, or every live token of that name. Returns how many."""
        return int(await self.db.fetchval(
            """
            WITH r AS (
                UPDATE api_tokens SET revoked_at = now()
                WHERE (token_id = $1 OR name = $1) AND revoked_at IS NULL
                RETURNING 1
            ) SELECT count(*) FROM r
            """,
            token_id_or_name,
        ))

    async def set_token_quotas(self, token_id_or_name: str, *,
                               admissions_per_minute: int | None | object = UNCHANGED,
                               signals_per_minute: int | None | object = UNCHANGED) -> int:
        """Change the quotas of a live token by ID, or of every live token of
        that name; a quota not given keeps its value. Returns how many tokens.
        Only live tokens: a revoked token's row stays as it was revoked."""
        return int(await self.db.fetchval(
            """
            WITH q AS (
                UPDATE api_tokens SET
                    admissions_per_minute = CASE WHEN $2 THEN $3 ELSE admissions_per_minute END,
                    signals_per_minute = CASE WHEN $4 THEN $5 ELSE signals_per_minute END
                WHERE (token_id = $1 OR name = $1) AND revoked_at IS NULL
                RETURNING 1
            ) SELECT count(*) FROM q
            """,
            token_id_or_name,
            admissions_per_minute is not UNCHANGED,
            None if admissions_per_minute is UNCHANGED else admissions_per_minute,
            signals_per_minute is not UNCHANGED,
            None if signals_per_minute is UNCHANGED else signals_per_minute,
        ))

    async def token_quotas(self) -> dict[str, tuple[int | None, int | None]]:
        """{token_id: (admissions_per_minute, signals_per_minute)} of the live
        tokens that have any quota: the whole snapshot an API process counts
        against. A plain read: it locks no token row, so it never waits on,
        nor holds up, anything a request does."""
        rows = await self.db.fetch(
            "SELECT token_id, admissions_per_minute, signals_per_minute FROM api_tokens "
            "WHERE revoked_at IS NULL "
            "AND (admissions_per_minute IS NOT NULL OR signals_per_minute IS NOT NULL)"
        )
        return {r["token_id"]: (r["admissions_per_minute"], r["signals_per_minute"]) for r in rows}

    async def find_token(self, token_id: str) -> TokenSecret | None:
        row = await self.db.fetchrow(
            "SELECT token_id, name, role, secret_sha256 FROM api_tokens "
            "WHERE token_id = $1 AND revoked_at IS NULL",
            token_id,
        )
        return record(TokenSecret, row) if row is not None else None
