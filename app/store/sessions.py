"""Dashboard sessions (ui_sessions): the browser holds a random 256-bit
session ID; only its SHA-256 is stored, with the token it was opened with and
when it expires. A session is valid while it is not ended, not expired, and
its token is not revoked, all checked in the one statement that reads it."""

from __future__ import annotations

from app.store.handle import StoreObject
from app.store.records import SessionToken


class Sessions(StoreObject):
    async def create_ui_session(self, session_sha256: str, token_id: str,
                                lifetime_seconds: float) -> bool:
        """Open a session for a token that is not revoked; the same statement
        clears sessions that can no longer be used (ended or expired), so the
        table holds only live ones plus those ended since the last sign-in.
        False: the token was revoked meanwhile (no session)."""
        status = await self.db.execute(
            """
            WITH cleared AS (
                DELETE FROM ui_sessions WHERE ended_at IS NOT NULL OR expires_at <= now()
            )
            INSERT INTO ui_sessions (session_sha256, token_id, expires_at)
            SELECT $1, token_id, now() + make_interval(secs => $3)
            FROM api_tokens WHERE token_id = $2 AND revoked_at IS NULL
            """,
            session_sha256, token_id, float(lifetime_seconds),
        )
        return status == "INSERT 0 1"

    async def find_ui_session(self, session_sha256: str) -> tuple[str, SessionToken | None]:
        """("valid", the token's row) or ("ended" | "expired" | "revoked" |
        "unknown", None). Whether the session is usable is decided here, in
        one statement with its token's revocation: revoking a token ends its
        sessions at once, with no cache in between."""
        row = await self.db.fetchrow(
            """
            SELECT s.ended_at IS NOT NULL AS ended, s.expires_at <= now() AS expired,
                   t.revoked_at IS NOT NULL AS revoked, t.token_id, t.name, t.role
            FROM ui_sessions s JOIN api_tokens t ON t.token_id = s.token_id
            WHERE s.session_sha256 = $1
            """,
            session_sha256,
        )
        if row is None:
            return "unknown", None
        for state in ("revoked", "ended", "expired"):
            if row[state]:
                return state, None
        return "valid", {"token_id": row["token_id"], "name": row["name"], "role": row["role"]}

    async def end_ui_session(self, session_sha256: str) -> bool:
        """Sign-out: the session ends now (a copy of the cookie opens nothing)."""
        ended = await self.db.fetchval(
            "UPDATE ui_sessions SET ended_at = now() "
            "WHERE session_sha256 = $1 AND ended_at IS NULL RETURNING true",
            session_sha256,
        )
        return bool(ended)
