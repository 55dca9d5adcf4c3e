"""Bulk operations: one action (cancel, redrive, resume, resolve) over every
execution a filter matched when the operation was created. The matched IDs
are stored as the operation's items in the creating statement, so what it
acts on never drifts; workers carry the items out in bounded batches, each
batch one transaction that takes its items FOR UPDATE SKIP LOCKED, acts on
each execution with the same statement the single-execution API uses, and
marks the item in that transaction — a crash mid-batch repeats nothing, and
two workers never act on one item."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.store.handle import ConnectionHandle, StoreObject
from app.store.operator import Operator, cancel_tree
from app.store.placement import placement_of
from app.store.records import OperationRecord, record
from app.store.redrive import Redrives

ACTIONS = ("cancel", "redrive", "resume", "resolve")
CancelOperationAnswer = Literal["cancelled", "not_found", "finished"]

SAMPLE = 10


def filter_sql(spec: dict[str, Any]) -> tuple[str, list[Any]]:
    """The WHERE clause of a filter ({workflowId, status, admittedFrom,
    admittedTo, minUnacknowledgedDeliveries, executionIds}; already
    validated) over `executions`, and its arguments from $1."""
    columns = {
        "workflowId": "workflow_id = ${}",
        "status": "status = ${}",
        "admittedFrom": "admitted_at >= ${}",
        "admittedTo": "admitted_at < ${}",
        "minUnacknowledgedDeliveries": "unacknowledged_deliveries >= ${}",
        "executionIds": "execution_id = ANY(${}::text[])",
    }
    clauses, args = [], []
    for name, clause in columns.items():
        value = spec.get(name)
        if value is None:
            continue
        if name in ("admittedFrom", "admittedTo") and isinstance(value, str):
            value = datetime.fromisoformat(value)
        args.append(value)
        clauses.append(clause.format(len(args)))
    if not clauses:
        raise ValueError("a filter needs at least one condition")
    return " AND ".join(clauses), args


class Operations(StoreObject):
    async def preview_operation(self, spec: dict[str, Any]) -> tuple[int, list[str]]:
        """A dry run: how many executions the filter matches now, and a sample
        (two reads: Citus cannot push a subquery in a select list down)."""
        where, args = filter_sql(spec)
        matched = await self.db.fetchval(
            f"""
            -- Citus: a filter over executions of every bucket (multi-shard)
            SELECT count(*) FROM executions WHERE {where}
            """, *args)
        sample = await self.db.fetch(
            f"""
            -- Citus: a filter over executions of every bucket (multi-shard)
            SELECT execution_id FROM executions WHERE {where}
            ORDER BY admitted_at, execution_id LIMIT {SAMPLE}
            """, *args)
        return matched, [r["execution_id"] for r in sample]

    async def create_operation(self, action: str, spec: dict[str, Any], *, by: str,
                               options: dict[str, Any] | None = None, reason: str | None = None,
                               max_matched: int = 100_000) -> OperationRecord | None:
        """Store the operation and its items (the executions the filter matches
        now); None when more than `max_matched` match. The matches are read
        first and stored by one statement after: on Citus a transaction that
        read the distributed executions in parallel may not then write the
        operations (reference) tables."""
        assert action in ACTIONS, action
        where, args = filter_sql(spec)
        matched = [r["execution_id"] for r in await self.db.fetch(
            f"""
            -- Citus: a filter over executions of every bucket (multi-shard)
            SELECT execution_id FROM executions WHERE {where}
            LIMIT {int(max_matched) + 1}
            """, *args)]
        if len(matched) > max_matched:
            return None
        row = await self.db.fetchrow(
            """
            WITH op AS (
                INSERT INTO operations (operation_id, action, filter, options, reason,
                                        created_by, status, matched)
                VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6, 'running',
                        cardinality($7::text[]))
                RETURNING operation_id
            ), items AS (
                INSERT INTO operation_items (operation_id, execution_id)
                SELECT op.operation_id, m FROM op, unnest($7::text[]) AS m
            )
            SELECT operation_id FROM op
            """,
            f"op-{secrets.token_hex(8)}", action, spec, options or {}, reason, by, matched)
        assert row is not None  # the statement always returns its row
        return await self.get_operation(row["operation_id"])

    async def get_operation(self, operation_id: str, *, failures: int = 100) -> OperationRecord | None:
        """The operation with its progress (items done, failed, pending) and
        its first `failures` failed items."""
        row = await self.db.fetchrow(
            """
            SELECT o.*,
                   (SELECT count(*) FILTER (WHERE i.status = 'done') FROM operation_items i
                    WHERE i.operation_id = o.operation_id) AS done,
                   (SELECT count(*) FILTER (WHERE i.status = 'failed') FROM operation_items i
                    WHERE i.operation_id = o.operation_id) AS failed,
                   (SELECT count(*) FROM operation_items i
                    WHERE i.operation_id = o.operation_id AND i.status = 'pending') AS pending,
                   (SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'execution_id', f.execution_id, 'code', f.code,
                               'message', f.message) ORDER BY f.done_at, f.execution_id),
                            '[]')
                    FROM (SELECT * FROM operation_items i
                          WHERE i.operation_id = o.operation_id AND i.status = 'failed'
                          ORDER BY i.done_at, i.execution_id LIMIT $2) f) AS failures
            FROM operations o WHERE o.operation_id = $1
            """, operation_id, failures)
        return record(OperationRecord, row) if row is not None else None

    async def cancel_operation(self, operation_id: str, by: str
                               ) -> tuple[CancelOperationAnswer, OperationRecord | None]:
        """Stop a running operation: items not yet carried out stay pending and
        are never acted on. What was done stays done."""
        row = await self.db.fetchrow(
            """
            UPDATE operations SET status = 'cancelled', finished_at = now(),
                   options = options || jsonb_build_object('cancelledBy', $2::text)
            WHERE operation_id = $1 AND status = 'running'
            RETURNING operation_id
            """, operation_id, by)
        record = await self.get_operation(operation_id)
        if record is None:
            return "not_found", None
        return ("cancelled" if row is not None else "finished"), record

    async def run_operation_batch(self, limit: int = 50) -> int:
        """Carry out up to `limit` pending items of running operations, in one
        transaction; returns how many were carried out. Operations with no
        pending item left are marked completed."""
        async def batch(conn: asyncpg.Connection) -> int:
            items = await conn.fetch(
                """
                SELECT i.operation_id, i.execution_id, o.action, o.options, o.reason,
                       o.created_by
                FROM operation_items i JOIN operations o USING (operation_id)
                WHERE i.status = 'pending' AND o.status = 'running'
                ORDER BY o.created_at, i.operation_id, i.execution_id
                LIMIT $1
                FOR UPDATE OF i SKIP LOCKED
                """, limit)
            for item in items:
                code, message = await self._apply_item(conn, item)
                await conn.execute(
                    """
                    UPDATE operation_items
                    SET status = CASE WHEN $3::text IS NULL THEN 'done' ELSE 'failed' END,
                        code = $3, message = $4, done_at = now()
                    WHERE operation_id = $1 AND execution_id = $2
                    """, item["operation_id"], item["execution_id"], code, message)
            await conn.execute(
                """
                UPDATE operations o SET status = 'completed', finished_at = now()
                WHERE o.status = 'running' AND o.operation_id = ANY($1::text[])
                  AND NOT EXISTS (SELECT 1 FROM operation_items i
                                  WHERE i.operation_id = o.operation_id
                                    AND i.status = 'pending')
                """, sorted({i["operation_id"] for i in items}))
            return len(items)

        done = await self.db.run_in_transaction(batch)
        if done == 0:
            # Operations that matched nothing (or whose last batch raced).
            await self.db.execute(
                """
                UPDATE operations o SET status = 'completed', finished_at = now()
                WHERE o.status = 'running'
                  AND NOT EXISTS (SELECT 1 FROM operation_items i
                                  WHERE i.operation_id = o.operation_id
                                    AND i.status = 'pending')
                """)
        return done

    async def _apply_item(self, conn: asyncpg.Connection,
                          item: asyncpg.Record) -> tuple[str | None, str | None]:
        """Act on one execution in the batch's transaction: (None, None) when
        done, else (error code, message) — the codes the single-execution API
        answers with."""
        eid, action, options = item["execution_id"], item["action"], item["options"]
        by = f"{item['created_by']} (operation {item['operation_id']})"
        # The batch's transaction: the single-execution statements join it.
        here = ConnectionHandle(conn)
        if action == "cancel":
            if await cancel_tree(conn, await placement_of(conn, self.config.placement), eid, by,
                                False) is not None:
                return None, None
            status = await conn.fetchval(
                "SELECT status FROM executions "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
            if status is None:
                return "EXECUTION_NOT_FOUND", f"no execution {eid!r}"
            return "EXECUTION_TERMINAL", f"already ended ({status})"
        if action == "redrive":
            answer, detail = await Redrives(here, self.config).redrive(
                eid, by, from_step=options.get("fromStep"),
                timeout_seconds=options.get("timeoutSeconds"), reason=item["reason"])
            return {
                "redriven": (None, None),
                "not_found": ("EXECUTION_NOT_FOUND", f"no execution {eid!r}"),
                "not_ended": ("EXECUTION_NOT_ENDED", f"execution is {detail}"),
                "completed": ("REDRIVE_NEEDS_FROM_STEP", "completed; give fromStep"),
                "step_not_found": ("STEP_NOT_FOUND", f"no recorded step {options.get('fromStep')!r}"),
            }[answer]
        if action == "resume":
            resumed, status = await Operator(here, self.config).resume(eid, by)
            if resumed == "resumed":
                return None, None
            if resumed == "not_found":
                return "EXECUTION_NOT_FOUND", f"no execution {eid!r}"
            return "EXECUTION_NOT_PARKED", (f"execution is {status}, not parked as poison "
                                            "or for nondeterminism")
        # resolve: the step the execution is parked on, as the operation says.
        resolution = options.get("resolution") or {}
        step = await conn.fetchval(
            "SELECT parked_step FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) "
            "AND status = 'parked' AND parked_reason = 'outcome_unknown'", eid)
        if step is None:
            return "STEP_NOT_OUTCOME_UNKNOWN", "not parked on a step whose outcome is unknown"
        resolved, status = await Operator(here, self.config).resolve_step(
            eid, step, resolution.get("action", "retry"), by=by,
            result=resolution.get("result"), error=resolution.get("error"))
        if resolved == "resolved":
            return None, None
        return "STEP_NOT_OUTCOME_UNKNOWN", f"step {step!r} is not waiting for a decision ({status})"
