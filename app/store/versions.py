"""Moving executions between code versions: an operator moves executions
whose recorded history the new code replays (checked before the move).

A move is read, checked, then written:
- `target` / `candidates` read what the check is made against (the
  execution's `Seen`: token, redrive count, status);
- the caller exports the history and replays it against the new code;
- `move` is one statement that changes the version only if the execution is
  still as seen, and nobody holds it. While nobody holds it (status not
  `running`), every change to its history first claims it (the token
  grows), follows an operator decision on a parked one (its status
  changes) or a redrive (the redrive count grows), so an unchanged `Seen`
  means the history the check replayed is the history the new code will
  replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import asyncpg

from app.schema import TERMINAL_STATUSES
from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, OnShard
from app.store.placement import shard_buckets, tell_claimers
from app.store.types import NOTIFY_CHANNEL, TERMINAL_SQL

MoveAnswer = Literal["moved", "not_found", "ended", "running", "changed"]
# A filter value meaning "any code version" (None is "unversioned").
ANY_VERSION = object()
# A bulk move checks each execution within one request: at most this many.
MAX_CANDIDATES = 1000


# The move of $1 to code version $2, in one statement on the execution's
# shard: the row locked and checked (not ended, not held, and, given the
# version check's view $6-$8, unchanged since), the version set (a
# nondeterminism park made due now) and the event.
_MOVE = OnShard("move_version", f"""
WITH cur AS (
    -- The row lock makes a concurrent claim either commit first
    -- (the token or status below then no longer match) or wait
    -- and claim the moved version.
    SELECT execution_id, code_version, token,
           status = 'parked' AND parked_reason = 'nondeterminism' AS unpark
    FROM executions
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND status NOT IN {TERMINAL_SQL}
      AND status <> 'running'
      AND ($6::bigint IS NULL
           OR (token = $6 AND redrives = $7 AND status = $8))
    FOR NO KEY UPDATE
), m AS (
    UPDATE executions e
    SET code_version = $2,
        status = CASE WHEN c.unpark
                      THEN CASE WHEN e.ever_suspended THEN 'suspended'
                                ELSE 'admitted' END
                      ELSE e.status END,
        parked_reason = CASE WHEN c.unpark THEN NULL ELSE e.parked_reason END,
        parked_step = CASE WHEN c.unpark THEN NULL ELSE e.parked_step END,
        parked_detail = CASE WHEN c.unpark THEN NULL ELSE e.parked_detail END,
        redeliver_after = CASE WHEN c.unpark THEN NULL ELSE e.redeliver_after END,
        due_at = CASE WHEN c.unpark THEN now() ELSE e.due_at END,
        event_seq = e.event_seq + 1,
        updated_at = now()
    FROM cur c
    WHERE e.execution_id = c.execution_id AND e.bucket = fencepost_bucket($1)
    RETURNING e.execution_id, e.token, e.status, c.code_version AS from_version,
              c.unpark, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq,
           'version_moved', token,
           jsonb_build_object('from', from_version, 'to', $2::text,
                              'by', $3::text, 'check', $4::text)
           || CASE WHEN $5::text IS NULL THEN '{{}}'::jsonb
                   ELSE jsonb_build_object('reason', $5::text) END
           || CASE WHEN unpark THEN jsonb_build_object('resumed', true)
                   ELSE '{{}}'::jsonb END
    FROM m
)
SELECT m.execution_id, m.token, m.status, m.from_version, m.unpark,
       (CASE WHEN m.unpark THEN pg_notify('{NOTIFY_CHANNEL}', '') END) IS NULL AS notified
FROM m
""", ("text", "text", "text", "text", "text", "bigint", "integer", "text"),
    (("execution_id", "text"), ("token", "bigint"), ("status", "text"),
     ("from_version", "text"), ("unpark", "boolean"), ("notified", "boolean")))


@dataclass(frozen=True)
class Seen:
    """An execution as the check saw it."""

    execution_id: str
    workflow_id: str
    code_version: str | None
    status: str
    token: int
    redrives: int
    parked_reason: str | None


@dataclass(frozen=True)
class Moved:
    """A move done: the version before and after, the status after, and
    whether it made a `nondeterminism`-parked execution due again."""

    execution_id: str
    from_version: str | None
    to_version: str | None
    status: str
    resumed: bool


_SEEN = "execution_id, workflow_id, code_version, status, token, redrives, parked_reason"


def _seen(row: asyncpg.Record) -> Seen:
    return Seen(row["execution_id"], row["workflow_id"], row["code_version"], row["status"],
                row["token"], row["redrives"], row["parked_reason"])


class Versions(StoreObject):
    async def target(self, execution_id: str) -> Seen | None:
        """The execution a move is checked against, read before its history
        is exported (None: no such execution)."""
        row = await self.db.fetchrow(
            f"SELECT {_SEEN} FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", execution_id)
        return _seen(row) if row is not None else None

    async def candidates(self, workflow_id: str, *, from_version: object = ANY_VERSION,
                         statuses: list[str] | None = None, ids: list[str] | None = None,
                         limit: int = 100) -> tuple[list[Seen], int]:
        """Unended executions of `workflow_id` (admitted under `from_version`,
        None: unversioned; in `statuses`; among `ids`), oldest admission
        first: at most `limit` of them, and how many match in all."""
        assert 1 <= limit <= MAX_CANDIDATES
        any_version = from_version is ANY_VERSION
        rows = await self.db.fetch(
            f"""
            -- Citus: a workflow's executions, of every bucket (multi-shard)
            WITH m AS (
                SELECT {_SEEN}, admitted_at FROM executions
                WHERE workflow_id = $1 AND status NOT IN {TERMINAL_SQL}
                  AND ($2 OR code_version IS NOT DISTINCT FROM $3::text)
                  AND ($4::text[] IS NULL OR status = ANY($4::text[]))
                  AND ($5::text[] IS NULL OR execution_id = ANY($5::text[]))
            )
            SELECT *, count(*) OVER () AS matched FROM m
            ORDER BY admitted_at, execution_id LIMIT $6
            """,
            workflow_id, any_version, None if any_version else from_version, statuses, ids,
            limit)
        return [_seen(r) for r in rows], (rows[0]["matched"] if rows else 0)

    async def move(self, execution_id: str, to_version: str | None, *, by: str, check: str,
                   reason: str | None = None, seen: Seen | None = None
                   ) -> tuple[MoveAnswer, Moved | None]:
        """Set the execution's code version to `to_version`, in one
        statement, unless it has ended or a delivery holds it (status
        `running`: a holder, even one whose lease expired but was not yet
        ended, can still record steps under its token), or, given `seen`,
        it is no longer as the check saw it. Writes `version_moved`; an
        execution parked for `nondeterminism` becomes due now (as resume
        makes it). `check` ("passed" / "skipped") is recorded as given."""
        buckets = await shard_buckets(self, execution_id)
        rows = await _MOVE.fetch(
            self.db, buckets, execution_id, to_version, by, check, reason,
            seen.token if seen is not None else None,
            seen.redrives if seen is not None else None,
            seen.status if seen is not None else None)
        row = rows[0] if rows else None
        if row is not None and row["unpark"]:
            await tell_claimers(self.db, buckets)
        if row is not None:
            return "moved", Moved(row["execution_id"], row["from_version"], to_version,
                                  row["status"], row["unpark"])
        return await self._why_not_moved(execution_id, seen), None

    async def _why_not_moved(self, execution_id: str, seen: Seen | None) -> MoveAnswer:
        """Why a move changed nothing (read after it: only chooses the answer)."""
        now = await self.target(execution_id)
        if now is None:
            return "not_found"
        if now.status in TERMINAL_STATUSES:
            return "ended"
        if now.status == "running":
            return "running"
        return "changed"
