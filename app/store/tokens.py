"""API tokens: created, listed, revoked, looked up. Only a SHA-256 of the
secret is stored; tokens are 256-bit random, so a fast hash is enough."""

from __future__ import annotations

import asyncpg


class TokenStatements:
    pool: asyncpg.Pool

    async def create_token(self, token_id: str, *, name: str, role: str, secret_sha256: str) -> None:
        await self.pool.execute(
            "INSERT INTO api_tokens (token_id, name, role, secret_sha256) VALUES ($1, $2, $3, $4)",
            token_id, name, role, secret_sha256,
        )

    async def list_tokens(self) -> list[dict]:
        rows = await self.pool.fetch(
            "SELECT token_id, name, role, created_at, revoked_at FROM api_tokens "
            "ORDER BY created_at"
        )
        return [dict(r) for r in rows]

    async def revoke_token(self, token_id_or_name: str) -> int:
        """Revoke by ID, or every live token of that name. Returns how many."""
        return await self.pool.fetchval(
            """
            WITH r AS (
                UPDATE api_tokens SET revoked_at = now()
                WHERE (token_id = $1 OR name = $1) AND revoked_at IS NULL
                RETURNING 1
            ) SELECT count(*) FROM r
            """,
            token_id_or_name,
        )

    async def find_token(self, token_id: str) -> dict | None:
        row = await self.pool.fetchrow(
            "SELECT token_id, name, role, secret_sha256 FROM api_tokens "
            "WHERE token_id = $1 AND revoked_at IS NULL",
            token_id,
        )
        return dict(row) if row is not None else None
