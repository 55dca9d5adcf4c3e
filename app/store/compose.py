"""How workflows compose with the world, each made safe by the fence or by a
receipt with a unique identity: transactional steps (the user's writes and
the step's receipt commit together), and child workflows (admitted under an
ID derived from the parent's step, so a repeat starts nothing new)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from app.store.fencing import INTERRUPT_SQL, rejected
from app.store.handle import StoreObject
from app.store.types import (
    ENDED_CHANNEL,
    NOTIFY_CHANNEL,
    TERMINAL_SQL,
    InvalidEvent,
    Lease,
    LeaseLost,
    StepRecord,
    step_record,
)

# Every statement that can end an execution wakes its parent in the same
# statement (this CTE) or in the same transaction (policy.after_ends, where a
# parent may be on another Citus shard), so a parent waiting for a child
# cannot miss the end. `{ended}` names a CTE returning (parent_execution_id,
# status) of the rows it ended.
# In the final select list of every statement that ends executions (the
# CTE `{ended}` returns execution_id and status): one notice per ended ID a
# long-poll waits for (watched_executions). A NOTIFY serializes commits across
# the database, so an end nobody waits for sends none.
ENDED_NOTICE = (f"(SELECT count(pg_notify('{ENDED_CHANNEL}', x.execution_id)) FROM {{ended}} x "
                f"WHERE x.status IN {TERMINAL_SQL} AND EXISTS (SELECT 1 FROM watched_executions w "
                "WHERE w.execution_id = x.execution_id "
                "AND w.bucket = fencepost_bucket(x.execution_id))) AS ended_notices")

# THE wake of a parent (a row `p`) by a child's end: due now, unless it has
# ended itself. Written here as a CTE; as a statement of its own in
# policy.after_ends.
WAKE_PARENT = "due_at = least(p.due_at, now()), updated_at = now()"
WAKEABLE_PARENT = f"p.status NOT IN {TERMINAL_SQL}"

WAKE_PARENTS = f"""
    parent_wake AS (
        UPDATE executions p SET {WAKE_PARENT}
        FROM (SELECT DISTINCT parent_execution_id FROM {{ended}}
              WHERE parent_execution_id IS NOT NULL AND status IN {TERMINAL_SQL}) c
        WHERE p.execution_id = c.parent_execution_id
          AND p.bucket = fencepost_bucket(c.parent_execution_id)
          AND {WAKEABLE_PARENT}
        RETURNING p.execution_id
    )"""


class TransactionFailed(Exception):
    """The user's function (or its result) failed inside a transactional
    step; the transaction was rolled back, nothing of it was committed."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


ChildAnswer = Literal["started", "existing", "conflict", "parent_cancelling"]


@dataclass(frozen=True)
class ChildExecution:
    """The execution a child start is about: the step's child (started, or
    existing: started before, under whatever ID), the ID asked for
    (parent_cancelling), or the unrelated holder of that ID (conflict: its
    status, "retired" for a retention tombstone, and workflow)."""

    execution_id: str
    status: str | None = None
    workflow_id: str | None = None


class Compose(StoreObject):
    async def transaction_step(
        self,
        lease: Lease,
        step_key: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        *,
        function_name: str,
        attempts: int,
        check_value: Callable[[Any], str | None],
        position: int | None = None,
    ) -> StepRecord:
        """Run `fn(conn, *args)` inside the transaction that checks the token
        and records the step's receipt: both commit, or neither does.

        FOR KEY SHARE on the execution row is held for the whole transaction:
        a claim that committed first makes the token check fail (LeaseLost,
        rolled back before `fn` runs); a claim (FOR UPDATE, like the reaper
        and cancellation) that comes later skips or waits for the row until
        this transaction has committed, and then finds the receipt. The
        weakest lock that does this: renewals (FOR NO KEY UPDATE) and
        signals still update the row meanwhile, so a transaction longer than
        the lease keeps its lease.
        A receipt already present returns the recorded result; `fn` does not run.
        On a store bound to a caller's transaction, all this runs in a savepoint
        of it (and `fn`'s session changes stay on the caller's connection).
        """
        try:
            return await self._transaction_step(lease, step_key, fn, args,
                                                function_name=function_name, attempts=attempts,
                                                check_value=check_value, position=position)
        except LeaseLost:
            # Recorded after the refused transaction rolled back.
            raise await rejected(self, lease, step_key) from None

    async def _transaction_step(
        self,
        lease: Lease,
        step_key: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        *,
        function_name: str,
        attempts: int,
        check_value: Callable[[Any], str | None],
        position: int | None = None,
    ) -> StepRecord:
        # The user's code may change session state (SET, prepared
        # statements): a pool connection is reset before it goes back.
        async with self.db.connection(reset=True) as conn:
            async with conn.transaction():
                fence = await conn.fetchrow(
                    f"""
                    SELECT {INTERRUPT_SQL} FROM executions
                    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                      AND token = $2 AND status = 'running'
                    FOR KEY SHARE
                    """,
                    lease.execution_id,
                    lease.token,
                )
                if fence is None:
                    raise LeaseLost(lease.execution_id, lease.token)
                existing = await conn.fetchrow(
                    """
                    SELECT step_key, status, value, error, function_name, attempts, token,
                           recorded_at
                    FROM execution_steps
                    WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2
                    """,
                    lease.execution_id,
                    step_key,
                )
                if existing is not None:
                    return step_record(existing, fence["interrupt"])
                try:
                    value = await fn(conn, *args)
                except Exception as exc:
                    raise TransactionFailed(exc) from exc
                problem = check_value(value)
                if problem is not None:
                    raise TransactionFailed(TypeError(
                        f"step {step_key!r} returned a value that is not JSON: {problem}"
                    ))
                try:
                    row = await conn.fetchrow(
                        """
                        WITH ins AS (
                            INSERT INTO execution_steps
                                (execution_id, bucket, step_key, status, value, function_name,
                                 attempts, token, position)
                            VALUES ($1, fencepost_bucket($1), $3, 'completed', $4, $5, $6, $2,
                                    $7)
                            RETURNING step_key, status, value, error, function_name,
                                      attempts, token, recorded_at
                        ), placed AS (
                            -- The event's place, on the row the fence holds.
                            UPDATE executions SET event_seq = event_seq + 1
                            WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                              AND EXISTS (SELECT 1 FROM ins)
                            RETURNING event_seq
                        ), ev AS (
                            INSERT INTO execution_events
                                (execution_id, bucket, seq, kind, token, detail)
                            SELECT $1, fencepost_bucket($1), event_seq, 'step_recorded', $2,
                                   jsonb_build_object('stepKey', $3::text,
                                                      'status', 'completed',
                                                      'transaction', true)
                            FROM placed
                        )
                        SELECT * FROM ins
                        """,
                        lease.execution_id,
                        lease.token,
                        step_key,
                        value,
                        function_name,
                        attempts,
                        position,
                    )
                except (ValueError, TypeError, asyncpg.DataError) as exc:
                    raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
                except asyncpg.InFailedSQLTransactionError as exc:
                    # fn caught a SQL error and carried on: the transaction
                    # is aborted, so nothing of it (nor the receipt) commits.
                    raise TransactionFailed(RuntimeError(
                        "the transaction was aborted by an error inside the step's "
                        "function; nothing was committed"
                    )) from exc
                assert row is not None  # the statement always returns its row
                return step_record(row, fence["interrupt"])

    async def start_child(
        self,
        lease: Lease,
        step_key: str,
        *,
        workflow_id: str,
        params: Any,
        child_id: str,
        timeout_seconds: float | None = None,
        queue: str = "default",
        concurrency_key: str | None = None,
        code_version: str | None = None,
    ) -> tuple[ChildAnswer, ChildExecution]:
        """Admit the child under `child_id`, linked to the parent's step, in
        the statement that checks the parent's fence: a stale holder (token no
        longer current, or the parent no longer running) starts nothing and
        gets LeaseLost; a parent being cancelled starts no new child.

        One child per (parent, step key) (unique index ux_executions_parent_step):
        a repeat of the step (replay, or a concurrent call with another child
        ID) answers "existing" with the ID of the child that step started. An
        ID taken by an unrelated execution, or retired by retention, is a
        conflict (status "retired" for the latter).

        Locks: the parent row (updated: its event's place), then the child insert. A child that
        already exists is seen in the statement's snapshot and not inserted
        again, so the insert never waits on a child row that is ending (and
        whose end waits for the parent row); it can only wait for a
        concurrent, uncommitted insert of the same step, which holds no lock
        this statement needs.
        """
        for _ in range(3):
            try:
                row = await self.db.fetchrow(
                    f"""
                    WITH parent AS (
                        -- The fence: same predicate as every fenced write, on
                        -- the row it updates (the place of child_started).
                        UPDATE executions SET event_seq = event_seq + 1
                        WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                          AND token = $7 AND status = 'running'
                        RETURNING execution_id, event_seq,
                                  cancel_requested_at IS NOT NULL AS cancelling
                    ), ins AS (
                        INSERT INTO executions
                            (execution_id, bucket, workflow_id, params, context, status, due_at,
                             deadline, parent_execution_id, parent_step_key, queue,
                             concurrency_key, priority, code_version, event_seq)
                        -- A child is ordered in its queue like its parent.
                        SELECT $3, fencepost_bucket($3), $4, coalesce($5, 'null'::jsonb),
                               '{{}}'::jsonb, 'admitted',
                               now(), now() + make_interval(secs => $6::float8), $1, $2, $8, $9,
                               (SELECT priority FROM executions
                                WHERE execution_id = $1 AND bucket = fencepost_bucket($1)), $10,
                               1
                        FROM parent
                        WHERE NOT parent.cancelling
                          -- Seen already (a repeat): nothing to insert, nothing to wait for.
                          -- Citus: the step's child, under any ID, may be in any bucket.
                          AND NOT EXISTS (SELECT 1 FROM executions
                                          WHERE (execution_id = $3
                                                 AND bucket = fencepost_bucket($3))
                                             OR (parent_execution_id = $1
                                                 AND parent_step_key = $2))
                          -- IDs are never reused.
                          AND NOT EXISTS (SELECT 1 FROM retired_executions
                                          WHERE execution_id = $3
                                            AND bucket = fencepost_bucket($3))
                        -- Either unique key: a concurrent start of this step or ID.
                        ON CONFLICT DO NOTHING
                        RETURNING execution_id
                    ), ev AS (
                        INSERT INTO execution_events (execution_id, bucket, seq, kind, detail)
                        SELECT $3, fencepost_bucket($3), 1, 'admitted',
                               jsonb_build_object('workflowId', $4::text,
                                                  'parentExecutionId', $1::text)
                        FROM ins
                        UNION ALL
                        SELECT $1, fencepost_bucket($1), parent.event_seq, 'child_started',
                               jsonb_build_object('stepKey', $2::text, 'childExecutionId', $3::text)
                        FROM ins, parent
                    ), new_queue AS (
                        -- Claims read the queues table: every execution's queue is in it.
                        INSERT INTO queues (name) SELECT $8 FROM ins
                        WHERE NOT EXISTS (SELECT 1 FROM queues WHERE name = $8)
                        ON CONFLICT DO NOTHING
                    )
                    SELECT (SELECT count(*) FROM parent) AS fenced,
                           (SELECT cancelling FROM parent) AS cancelling,
                           (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM ins) AS started
                    """,
                    lease.execution_id,
                    step_key,
                    child_id,
                    workflow_id,
                    params,
                    timeout_seconds,
                    lease.token,
                    queue,
                    concurrency_key,
                    code_version,
                )
            except (ValueError, TypeError, asyncpg.DataError) as exc:
                raise InvalidEvent(f"child params: {exc}") from exc
            assert row is not None  # the statement always returns its row
            if not row["fenced"]:
                raise await rejected(self, lease, step_key)
            if row["cancelling"]:
                return "parent_cancelling", ChildExecution(child_id)
            if row["started"]:
                return "started", ChildExecution(child_id)
            found = await self._child_or_holder(lease.execution_id, step_key, child_id)
            if found is not None:
                return found
            # The row seen in the snapshot was deleted since (retention): again.
        raise LeaseLost(lease.execution_id, lease.token)

    async def _child_or_holder(self, parent_id: str, step_key: str,
                               child_id: str) -> tuple[ChildAnswer, ChildExecution] | None:
        """Why start_child inserted nothing: the step's child, else whoever
        holds (or held: a tombstone) the ID; None when neither exists."""
        rows = await self.db.fetch(
            """
            SELECT execution_id, status, workflow_id,
                   (parent_execution_id = $1 AND parent_step_key = $2) IS TRUE AS linked
            FROM executions
            -- Citus: the step's child, under any ID, may be in any bucket.
            WHERE (execution_id = $3 AND bucket = fencepost_bucket($3))
               OR (parent_execution_id = $1 AND parent_step_key = $2)
            UNION ALL
            SELECT execution_id, 'retired', workflow_id, false
            FROM retired_executions WHERE execution_id = $3 AND bucket = fencepost_bucket($3)
            """,
            parent_id,
            step_key,
            child_id,
        )
        for r in rows:
            if r["linked"]:
                return "existing", ChildExecution(r["execution_id"])
        if rows:
            return "conflict", ChildExecution(child_id, rows[0]["status"],
                                              rows[0]["workflow_id"])
        return None

    async def child_status(self, child_id: str) -> tuple[str | None, dict[str, Any] | None]:
        """(status, outcome) of a child; (None, None) when it does not exist."""
        row = await self.db.fetchrow(
            "SELECT status, outcome FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", child_id
        )
        return (row["status"], row["outcome"]) if row is not None else (None, None)
