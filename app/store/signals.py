"""Signals: delivered from outside unfenced, consumed once by a fenced step."""

from __future__ import annotations

from typing import Any, Literal

import asyncpg

from app.store.types import (
    _TERMINAL_SQL,
    INTERRUPT_SQL,
    NOTIFY_CHANNEL,
    InvalidEvent,
    Lease,
    LeaseLost,
    StepRecord,
    _step,
)

SignalAnswer = Literal["received", "not_found", "terminal"]


class SignalStatements:
    pool: asyncpg.Pool

    async def send_signal(
        self, execution_id: str, name: str, payload: Any
    ) -> tuple[SignalAnswer, str | None]:
        """Store the signal and request a wake (due now) in one statement.
        Returns ("received", None), ("not_found", None) or ("terminal", status)."""
        try:
            row = await self.pool.fetchrow(
                f"""
                WITH target AS (
                    -- One row lock, taken once, by the write itself: the wake
                    -- (an UPDATE, FOR NO KEY UPDATE) comes first, so concurrent
                    -- senders queue on the row instead of each holding a FOR
                    -- SHARE lock and then waiting for the others' to upgrade
                    -- (a deadlock). Re-checked on the current row version, so
                    -- no terminal acknowledgement can land between this check
                    -- and the insert below; and signal_id is drawn under the
                    -- lock, so signal_id order is the order senders got the row.
                    UPDATE executions SET due_at = least(due_at, now()), updated_at = now()
                    WHERE execution_id = $1 AND status NOT IN {_TERMINAL_SQL}
                    RETURNING execution_id
                ), sig AS (
                    INSERT INTO signals (execution_id, name, payload)
                    SELECT execution_id, $2, coalesce($3, 'null'::jsonb) FROM target
                    RETURNING signal_id
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, detail)
                    SELECT $1, 'signal_received',
                           jsonb_build_object('name', $2::text, 'signalId', signal_id)
                    FROM sig
                )
                SELECT signal_id, pg_notify('{NOTIFY_CHANNEL}', '') FROM sig
                """,
                execution_id,
                name,
                payload,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc
        if row is not None:
            return "received", None
        status = await self.pool.fetchval(
            "SELECT status FROM executions WHERE execution_id = $1", execution_id
        )
        return ("not_found", None) if status is None else ("terminal", status)

    async def consume_signal(self, lease: Lease, step_key: str, name: str) -> StepRecord | None:
        """Take the oldest pending signal `name` into step `step_key`, fenced:
        the signal is marked consumed and the step recorded in one statement,
        or neither. Returns the step (already recorded: the recorded one), or
        None when no such signal is pending."""
        row = await self.pool.fetchrow(
            f"""
            WITH fence AS (
                SELECT execution_id, {INTERRUPT_SQL} FROM executions
                WHERE execution_id = $1 AND token = $2 AND status = 'running'
                FOR SHARE
            ), recorded AS (
                SELECT step_key FROM execution_steps WHERE execution_id = $1 AND step_key = $3
            ), pending AS (
                SELECT s.signal_id, s.payload FROM signals s, fence
                WHERE s.execution_id = $1 AND s.name = $4 AND s.consumed_step IS NULL
                  AND NOT EXISTS (SELECT 1 FROM recorded)
                ORDER BY s.signal_id
                LIMIT 1
                FOR UPDATE OF s SKIP LOCKED
            ), taken AS (
                UPDATE signals SET consumed_step = $3, consumed_token = $2, consumed_at = now()
                FROM pending WHERE signals.signal_id = pending.signal_id
                RETURNING signals.signal_id, signals.payload
            ), ins AS (
                INSERT INTO execution_steps
                    (execution_id, step_key, status, value, function_name, token)
                SELECT $1, $3, 'completed', payload, 'signal:' || $4, $2 FROM taken
                RETURNING step_key, status, value, error, function_name, attempts, token,
                          recorded_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT $1, 'signal_consumed', $2,
                       jsonb_build_object('name', $4::text, 'stepKey', $3::text,
                                          'signalId', signal_id)
                FROM taken
            )
            SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT interrupt FROM fence) AS interrupt,
                   (SELECT count(*) FROM recorded) AS already, ins.*
            FROM (SELECT 1) AS one LEFT JOIN ins ON true
            """,
            lease.execution_id,
            lease.token,
            step_key,
            name,
        )
        if not row["fenced"]:
            await self._fenced_write_rejected(lease, step_key)
            raise LeaseLost(lease.execution_id, lease.token)
        if row["step_key"] is not None:
            return _step(row, row["interrupt"])
        if row["already"]:
            existing = await self.pool.fetchrow(
                """
                SELECT step_key, status, value, error, function_name, attempts, token,
                       recorded_at
                FROM execution_steps WHERE execution_id = $1 AND step_key = $2
                """,
                lease.execution_id,
                step_key,
            )
            return _step(existing, row["interrupt"])
        return None
