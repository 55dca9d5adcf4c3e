"""Signals: delivered from outside unfenced, consumed once by a fenced step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from app.schema import TERMINAL_STATUSES as TERMINAL
from app.store.fencing import FENCE_CTE, rejected
from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, NEXT_SIGNAL_ID, OnShard
from app.store.placement import shard_buckets, tell_claimers
from app.store.types import (
    NOTIFY_CHANNEL,
    TERMINAL_SQL,
    InvalidEvent,
    Lease,
    StepRecord,
    step_record,
)

SignalAnswer = Literal["received", "not_found", "terminal", "forbidden", "too_many"]


@dataclass(frozen=True)
class SignalSender:
    """Who sent a signal: `token_id` and `name` of the API token (or, through
    the dashboard, the operator's session token and actor name), and its
    `role` ("trigger" or "operate"). `token_id` is None when authentication
    is disabled (name "anonymous"). Recorded in the signal row and its event;
    the SDK exports this class as `app.sdk.SignalSender`."""

    token_id: str | None
    name: str
    role: str


def signal_function_name(name: str, with_sender: bool) -> str:
    """The function name a consumed signal's step is recorded under; the two
    shapes of its value have different names, so a replay whose code changed
    shape is a ReplayError, never a misread value."""
    return f"signal-with-sender:{name}" if with_sender else f"signal:{name}"


# Under the target's row lock (taken by the caller's statement before, in its
# transaction): the signal with its sender, its event and the wake, in one
# statement, unless $7 unconsumed signals are already stored (then nothing).
_STORE_SIGNAL = OnShard("store_signal", f"""
WITH pending AS (
    SELECT count(*) AS n FROM signals
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND consumed_step IS NULL
), sig AS (
    INSERT INTO signals (signal_id, execution_id, bucket, name, payload, sender_token_id,
                         sender_name, sender_role)
    SELECT {NEXT_SIGNAL_ID}, $1, fencepost_bucket($1), $2, coalesce($3, 'null'::jsonb),
           $4, $5, $6
    FROM pending
    WHERE $7::bigint IS NULL OR pending.n < $7
    RETURNING signal_id
), wake AS (
    UPDATE executions AS e SET due_at = least(e.due_at, now()), event_seq = e.event_seq + 1,
                               updated_at = now()
    FROM sig
    WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
    RETURNING e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), wake.event_seq, 'signal_received',
           jsonb_build_object('name', $2::text, 'signalId', signal_id,
                              'sender', CASE WHEN $5::text IS NULL THEN NULL ELSE
                                  jsonb_build_object('tokenId', $4::text,
                                                     'name', $5::text,
                                                     'role', $6::text) END)
    FROM sig, wake
)
-- On Citus this NOTIFY reaches no one (it runs on a worker node):
-- the caller sends its own (tell_claimers).
SELECT (SELECT signal_id FROM sig) AS signal_id, (SELECT n FROM pending) AS pending,
       (SELECT pg_notify('{NOTIFY_CHANNEL}', '') FROM sig) IS NULL AS notified
""", ("text", "text", "jsonb", "text", "text", "text", "bigint"),
    (("signal_id", "bigint"), ("pending", "bigint"), ("notified", "boolean")))

# The oldest pending signal $4 taken into step $3, fenced: the signal marked
# consumed and the step recorded in one statement, or neither.
_CONSUME_SIGNAL = OnShard("consume_signal", f"""
WITH {FENCE_CTE}, recorded AS (
    SELECT step_key FROM execution_steps
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $3
), pending AS (
    SELECT s.signal_id, s.payload, s.sender_token_id, s.sender_name, s.sender_role
    FROM signals s JOIN fence ON true
    WHERE s.execution_id = $1 AND s.bucket = fencepost_bucket($1)
      AND s.name = $4 AND s.consumed_step IS NULL
      AND NOT EXISTS (SELECT 1 FROM recorded)
    ORDER BY s.signal_id
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), taken AS (
    UPDATE signals AS sg SET consumed_step = $3, consumed_token = $2, consumed_at = now()
    FROM pending
    WHERE sg.signal_id = pending.signal_id AND sg.bucket = fencepost_bucket($1)
    RETURNING sg.signal_id, sg.payload, pending.sender_token_id,
              pending.sender_name, pending.sender_role
), ins AS (
    INSERT INTO execution_steps
        (execution_id, bucket, step_key, status, value, function_name, token, position)
    SELECT $1, fencepost_bucket($1), $3, 'completed',
           CASE WHEN $5 THEN jsonb_build_object(
               'payload', payload,
               'sender', CASE WHEN sender_name IS NULL THEN 'null'::jsonb ELSE
                   jsonb_build_object('tokenId', sender_token_id,
                                      'name', sender_name,
                                      'role', sender_role) END)
           ELSE payload END,
           $6, $2, $7 FROM taken
    RETURNING step_key, status, value, error, function_name, attempts, token, recorded_at
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), (SELECT event_seq FROM fence),
           'signal_consumed', $2,
           jsonb_build_object('name', $4::text, 'stepKey', $3::text,
                              'signalId', signal_id)
    FROM taken
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT interrupt FROM fence) AS interrupt,
       (SELECT count(*) FROM recorded) AS already, ins.*
FROM (SELECT 1) AS one LEFT JOIN ins ON true
""", ("text", "bigint", "text", "text", "boolean", "text", "integer"),
    (("fenced", "bigint"), ("interrupt", "text"), ("already", "bigint"),
     ("step_key", "text"), ("status", "text"), ("value", "jsonb"), ("error", "jsonb"),
     ("function_name", "text"), ("attempts", "integer"), ("token", "bigint"),
     ("recorded_at", "timestamptz")))


class Signals(StoreObject):
    async def send_signal(
        self, execution_id: str, name: str, payload: Any, *,
        sender: SignalSender | None = None, owner: str | None = None,
        denied_workflows: Sequence[str] = (), max_pending: int | None = None,
    ) -> tuple[SignalAnswer, str | None]:
        """Store the signal and request a wake (due now), or nothing.
        `owner`: only an execution admitted by that token is a target (a
        trigger token's signal); `denied_workflows`: executions of these
        workflows refuse this sender (the workflow restricts who may send
        `name`); `max_pending`: refuse once that many signals are unconsumed.
        Returns ("received", None), ("not_found", None), ("terminal", status),
        ("forbidden", workflow_id) or ("too_many", pending count)."""
        denied = list(denied_workflows)

        # Before the transaction (see shard_buckets): many senders at once
        # would otherwise hold the whole pool, each waiting for one more.
        buckets = await shard_buckets(self, execution_id)

        async def send(conn: asyncpg.Connection) -> asyncpg.Record | None:
            target = await self._lock_signal_target(conn, execution_id, owner, denied)
            if target is None:
                return None
            return await self._store_signal(conn, buckets, execution_id, name, payload,
                                            sender, max_pending)

        try:
            row = await self.db.run_in_transaction(send)
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc
        if row is not None and row["signal_id"] is not None:
            return "received", None
        if row is not None:
            return "too_many", str(row["pending"])
        return await self._why_no_signal(execution_id, owner, denied)

    async def _lock_signal_target(self, conn: asyncpg.Connection, execution_id: str,
                                  owner: str | None, denied: list[str]) -> asyncpg.Record | None:
        """The target row, locked FOR NO KEY UPDATE (the lock the wake's UPDATE
        takes, so concurrent senders queue on the row instead of upgrading
        shared locks into a deadlock), or None. The owner predicate and the
        workflow's sender restriction sit in this same statement as the lock:
        no check-then-act gap, and the row (with its owner and workflow, which
        never change) stays locked until the signal is stored. Re-checked on
        the current row version, so no terminal acknowledgement lands between
        this check and the insert."""
        return await conn.fetchrow(
            f"""
            SELECT execution_id FROM executions
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
              AND status NOT IN {TERMINAL_SQL}
              AND ($2::text IS NULL OR admitted_by = $2)
              AND workflow_id <> ALL($3::text[])
            FOR NO KEY UPDATE
            """,
            execution_id,
            owner,
            denied,
        )

    async def _store_signal(self, conn: asyncpg.Connection, buckets: list[int] | None,
                            execution_id: str, name: str,
                            payload: Any, sender: SignalSender | None,
                            max_pending: int | None) -> asyncpg.Record | None:
        """Under the target's row lock: store the signal with its sender, its
        event, and the wake, in one statement, unless `max_pending` unconsumed
        signals are already stored (then nothing). The count runs in this
        statement's snapshot, taken after the lock was granted, so it sees
        every signal earlier senders committed: the bound is exact. signal_id
        is drawn under the lock, so signal_id order is the order senders got
        the row."""
        rows = await _STORE_SIGNAL.fetch(
            conn, buckets, execution_id, name, payload,
            sender.token_id if sender else None, sender.name if sender else None,
            sender.role if sender else None, max_pending)
        if rows and rows[0]["signal_id"] is not None:
            await tell_claimers(conn, buckets)
        return rows[0] if rows else None

    async def _why_no_signal(self, execution_id: str, owner: str | None,
                             denied: list[str]) -> tuple[SignalAnswer, str | None]:
        """Why the locking read found no target (nothing was written): a
        missing or (for `owner`) foreign execution is not_found alike; then
        terminal; then a sender the workflow refuses."""
        row = await self.db.fetchrow(
            "SELECT status, admitted_by, workflow_id FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)",
            execution_id,
        )
        if row is None or (owner is not None and row["admitted_by"] != owner):
            return "not_found", None
        if row["status"] in TERMINAL:
            return "terminal", row["status"]
        if row["workflow_id"] in denied:
            return "forbidden", row["workflow_id"]
        # Admitted after the locking read looked: it did not exist then.
        return "not_found", None

    async def consume_signal(self, lease: Lease, step_key: str, name: str, *,
                             with_sender: bool = False,
                             position: int | None = None) -> StepRecord | None:
        """Take the oldest pending signal `name` into step `step_key`, fenced:
        the signal is marked consumed and the step recorded in one statement,
        or neither. The step's value is the payload or, `with_sender`,
        {"payload": ..., "sender": {"tokenId", "name", "role"} or null}: what
        the workflow was handed is what is recorded, so replays agree. Returns
        the step (already recorded: the recorded one), or None when no such
        signal is pending."""
        rows = await _CONSUME_SIGNAL.fetch(
            self.db, await shard_buckets(self, lease.execution_id), lease.execution_id,
            lease.token, step_key, name, with_sender, signal_function_name(name, with_sender),
            position)
        row = rows[0]
        if not row["fenced"]:
            raise await rejected(self, lease, step_key)
        if row["step_key"] is not None:
            return step_record(row, row["interrupt"])
        if row["already"]:
            existing = await self.db.fetchrow(
                """
                SELECT step_key, status, value, error, function_name, attempts, token,
                       recorded_at
                FROM execution_steps
                WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2
                """,
                lease.execution_id,
                step_key,
            )
            assert existing is not None  # recorded: the insert above met it
            return step_record(existing, row["interrupt"])
        return None
