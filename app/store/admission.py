"""Admission: an execution and its first wake recorded in one statement, under
an ID that is never reused.

On the pool, concurrent admissions in one process are combined (group
commit): a batch is admitted by one statement, and any request that
statement did not admit is answered alone by the single-request statement,
the one rule for every refusal (ID taken, retired, taken by another request
of the same batch) and for values Postgres cannot store. Both statements are
built from one template, so they admit alike."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.dberrors import is_infrastructure
from app.store.buckets import bucket_of
from app.store.group_commit import GroupCommit
from app.store.handle import Handle, StoreConfig, StoreObject
from app.store.on_shard import NEXT_EVENT_ID, OnShard, send_notices
from app.store.placement import Placement, placement_of
from app.store.retry import RetryingPool
from app.store.types import NOTIFY_CHANNEL, Admitted, Conflict, InvalidEvent


@dataclass(frozen=True)
class Existing:
    """Admission with ifExists=return found the ID held by an execution of the
    same workflow with equal params: the very same admission, made before."""

    execution_id: str
    status: str


@dataclass(frozen=True)
class _Request:
    """One admission's values, in the order of the statement's columns
    (`_COLUMN_TYPES`)."""

    execution_id: str
    workflow_id: str
    params: Any
    context: dict[str, Any]
    deadline: datetime | None
    code_version: str | None
    timeout_seconds: float | None
    admitted_by: str | None
    traceparent: str | None
    request_id: str | None
    queue: str
    concurrency_key: str | None
    priority: int
    start_at: datetime | None
    delay_seconds: float | None


_COLUMN_TYPES = ("text", "text", "jsonb", "jsonb", "timestamptz", "text", "float8", "text",
                 "text", "text", "text", "text", "int4", "timestamptz", "float8")
_COLUMNS = tuple(f.name for f in dataclasses.fields(_Request))
assert len(_COLUMNS) == len(_COLUMN_TYPES)


def _admission_sql(requests: str) -> str:
    """The admission statement over `requests`: rows of `_COLUMNS` plus
    `ord` (the request's position), at most one row per execution ID. It
    returns (ord, execution_id, status) for each request it admitted."""
    return f"""
    WITH r AS ({requests}), ins AS (
        INSERT INTO executions
            (execution_id, bucket, workflow_id, params, context, status, due_at,
             deadline, code_version, admitted_by, traceparent, queue,
             concurrency_key, priority, event_seq)
        -- Python None is SQL NULL on the wire; as params it means JSON null.
        SELECT r.execution_id, fencepost_bucket(r.execution_id), r.workflow_id,
               coalesce(r.params, 'null'::jsonb), r.context, 'admitted',
               greatest(now(), coalesce(r.start_at, now()
                   + make_interval(secs => coalesce(r.delay_seconds, 0)))),
               coalesce(r.deadline, now() + make_interval(secs => r.timeout_seconds)),
               r.code_version, r.admitted_by, r.traceparent, r.queue, r.concurrency_key,
               r.priority, 1
        FROM r
        -- IDs are never reused: not a retired one, and not one whose
        -- row this statement sees. (A row being deleted by retention
        -- is still seen: the insert must not wait for that delete
        -- and then take the ID its tombstone is retiring.)
        WHERE NOT EXISTS (SELECT 1 FROM retired_executions t
                          WHERE t.execution_id = r.execution_id
                            AND t.bucket = fencepost_bucket(r.execution_id))
          AND NOT EXISTS (SELECT 1 FROM executions e
                          WHERE e.execution_id = r.execution_id
                            AND e.bucket = fencepost_bucket(r.execution_id))
        -- Rows are inserted in ID order, so two statements waiting on each
        -- other's uncommitted IDs always wait in one direction (no deadlock).
        ORDER BY r.execution_id
        ON CONFLICT (execution_id, bucket) DO NOTHING
        RETURNING execution_id, status, queue
    ), ev AS (
        -- Place 1 of the history: the counter (event_seq) starts there.
        INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, detail)
        SELECT {NEXT_EVENT_ID}, ins.execution_id, fencepost_bucket(ins.execution_id), 1,
               'admitted',
               jsonb_strip_nulls(jsonb_build_object('workflowId', r.workflow_id,
                                                    'requestId', r.request_id))
        FROM ins JOIN r USING (execution_id)
    )
    -- NOTIFY is delivered on commit, so idle workers start at once (on
    -- Citus it reaches none: see _DUE).
    SELECT r.ord, ins.execution_id, ins.status,
           pg_notify('{NOTIFY_CHANNEL}', '') IS NULL AS notified
    FROM ins JOIN r USING (execution_id)
    """


_ANSWER = (("ord", "bigint"), ("execution_id", "text"), ("status", "text"),
           ("notified", "boolean"))
# One request: its values as parameters $1..$15.
_ADMIT_ONE = OnShard("admit", _admission_sql(
    "SELECT " + ", ".join(f"${i}::{t} AS {c}" for i, (c, t)
                          in enumerate(zip(_COLUMNS, _COLUMN_TYPES, strict=True), 1))
    + ", 1::bigint AS ord"), _COLUMN_TYPES, _ANSWER)
# A batch: one array per column, but a JSON column's values travel as one
# JSON array (encoded, and refused, exactly as a single value is), the
# request's own picked by position. Of requests sharing an ID only the first
# is here; the others are answered alone, after it, as any request for a
# taken ID is.
_ADMIT_BATCH = OnShard("admit_batch", _admission_sql(
    "SELECT DISTINCT ON (u.execution_id) "
    + ", ".join(f"${i}::jsonb -> (u.ord - 1)::int AS {c}" if t == "jsonb" else f"u.{c}"
                for i, (c, t) in enumerate(zip(_COLUMNS, _COLUMN_TYPES, strict=True), 1))
    + ", u.ord FROM unnest("
    + ", ".join(f"${i}::{t}[]" for i, t in enumerate(_COLUMN_TYPES, 1) if t != "jsonb")
    + ") WITH ORDINALITY AS u("
    + ", ".join(c for c, t in zip(_COLUMNS, _COLUMN_TYPES, strict=True) if t != "jsonb")
    + ", ord) ORDER BY u.execution_id, u.ord"),
    tuple("jsonb" if t == "jsonb" else f"{t}[]" for t in _COLUMN_TYPES), _ANSWER)

# Idle workers are told an admission is due (in the statement on one
# Postgres; on Citus by the admitting connection, after it: send_notices).
_DUE = [(NOTIFY_CHANNEL, "")]

# What a value Postgres cannot store raises: NaN/Infinity (the encoder
# refuses them), \u0000 and lone surrogates (jsonb and text refuse them).
_UNSTORABLE = (ValueError, TypeError, asyncpg.DataError)


def _each_alone(part: list[_Request], exc: BaseException) -> list[asyncpg.Record | None]:
    """A batch part that failed: the database failing is everyone's answer;
    anything else may be one request's own, so each is admitted alone."""
    if is_infrastructure(exc):
        raise exc
    return [None] * len(part)


class Admissions(StoreObject):
    def __init__(self, db: Handle, config: StoreConfig) -> None:
        super().__init__(db, config)
        # On the pool, concurrent admissions share statements. In a caller's
        # transaction, each admission is its own statement in that transaction.
        self.group: GroupCommit[_Request, Admitted | None] | None = (
            GroupCommit(self._admit_batch) if isinstance(db, RetryingPool) else None)

    async def admit(
        self,
        *,
        workflow_id: str,
        params: Any,
        context: dict[str, Any] | None = None,
        execution_id: str | None = None,
        deadline: datetime | None = None,
        timeout_seconds: float | None = None,
        code_version: str | None = None,
        admitted_by: str | None = None,
        if_exists: Literal["error", "return"] = "error",
        traceparent: str | None = None,
        request_id: str | None = None,
        queue: str = "default",
        concurrency_key: str | None = None,
        priority: int = 0,
        start_at: datetime | None = None,
        delay_seconds: float | None = None,
    ) -> Admitted | Conflict | Existing:
        """Record the execution and its first wake (due now) in one statement,
        or report the record that already holds the ID. IDs are never reused.
        The deadline is `deadline`, else admission time + `timeout_seconds`
        (database clock), else none. With if_exists="return", an ID held by
        an execution of the same workflow with equal params is `Existing`.
        Flow control: the execution is on `queue` (created, unlimited, if no
        one declared it), counted under `concurrency_key`, ordered by
        `priority` among the queue's due executions, and first due at
        `start_at`, else `delay_seconds` after admission, else now.

        On the pool the request first joins a batch; whatever the batch did
        not admit is answered by the single statement, alone."""
        request = _Request(
            execution_id=execution_id or str(uuid.uuid4()), workflow_id=workflow_id,
            params=params, context=context if context is not None else {}, deadline=deadline,
            code_version=code_version, timeout_seconds=timeout_seconds,
            admitted_by=admitted_by, traceparent=traceparent, request_id=request_id,
            queue=queue, concurrency_key=concurrency_key, priority=priority,
            start_at=start_at, delay_seconds=delay_seconds)
        if self.group is not None:
            admitted = await self.group.submit(request)
            if admitted is not None:
                return admitted
        return await self._admit_alone(request, if_exists)

    async def _admit_batch(self, requests: Sequence[_Request]) -> list[Admitted | None]:
        """Admit a batch in one statement: each request's `Admitted`, or None
        for a request it did not admit (the caller then admits it alone,
        which answers why). One unstorable value fails the whole statement,
        and nothing is stored: then every request is admitted alone, so only
        that one request's answer is the error. A failing database is every
        request's error."""
        try:
            await self._queues_exist({r.queue for r in requests})
            # On Citus each shard's part commits on its own: a part that
            # failed is answered alone, request by request, and the others
            # keep their answers (admitted is admitted).
            placement = await self._placement()
            rows = await placement.per_shard(
                requests, lambda r: r.execution_id, self._admit_part, on_error=_each_alone,
                at_once=isinstance(self.db, RetryingPool))
            if placement.distributed and any(row is not None for row in rows):
                await send_notices(self.db, _DUE)
        except Exception as exc:
            if is_infrastructure(exc):  # the database failing: every request's answer
                raise
            # Anything else may be one request's own (an unstorable value,
            # a key too long for its index): each is answered alone.
            return [None] * len(requests)
        return [None if row is None else Admitted(row["execution_id"], row["status"])
                for row in rows]

    async def _admit_alone(self, request: _Request,
                           if_exists: Literal["error", "return"]) -> Admitted | Conflict | Existing:
        """The single statement: admit, or answer who holds the ID. A batch
        only ever answers "admitted"; every refusal is judged here. An ID
        refused and then found free (its row deleted, without a tombstone, in
        between) is tried again: three tries in all."""
        args = [getattr(request, c) for c in _COLUMNS]
        placement = await self._placement()
        buckets = [bucket_of(request.execution_id)] if placement.distributed else None
        for _ in range(3):
            try:
                await self._queues_exist({request.queue})
                rows = await _ADMIT_ONE.fetch(self.db, buckets, *args)
            except _UNSTORABLE as exc:
                # Nothing was stored.
                raise InvalidEvent(str(exc)) from exc
            if rows:
                if placement.distributed:
                    await send_notices(self.db, _DUE)
                return Admitted(rows[0]["execution_id"], rows[0]["status"])
            holder = await self._id_holder(request.execution_id, request.workflow_id,
                                           request.params)
            if isinstance(holder, Existing) and if_exists == "error":
                return Conflict(holder.execution_id, holder.status, request.workflow_id)
            if holder is not None:
                return holder
            # Seen, then deleted before this read without a tombstone: again.
        raise RuntimeError(f"admission of {request.execution_id!r} found the ID taken and "
                           "then free, three times")

    async def _admit_part(self, requests: list[_Request],
                          buckets: list[int] | None) -> list[asyncpg.Record | None]:
        """The batch statement over `requests` (on Citus all on one shard,
        `buckets` theirs): each request's row if it was admitted, else None."""
        rows = await _ADMIT_BATCH.fetch(
            self.db, buckets, *[[getattr(r, c) for r in requests] for c in _COLUMNS])
        by_ord = {row["ord"]: row for row in rows}
        return [by_ord.get(n) for n in range(1, len(requests) + 1)]

    async def _placement(self) -> Placement:
        return await placement_of(self.db, self.config.placement)

    async def _queues_exist(self, names: set[str]) -> None:
        """Claims read the queues table: every execution's queue is in it,
        before the execution is: inserted first (committed, on the pool; in a
        caller's transaction, in that transaction, so both commit or neither).
        Remembered only once committed on the pool: a name remembered from a
        transaction that then rolled back would leave executions without their
        queue row, never claimed (queues are never deleted)."""
        known = self.config.placement.queues
        new = sorted(names - known)
        if new:
            await self.db.execute(
                "INSERT INTO queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", new)
            if isinstance(self.db, RetryingPool):
                known.update(new)

    async def _id_holder(self, execution_id: str, workflow_id: str,
                         params: Any) -> Conflict | Existing | None:
        """Who holds an ID admission refused: the execution (`Existing` when
        it has this workflow and JSON-equal params), or its tombstone (status
        'retired': deleted by retention, never to be reused). Workflow and
        params are never updated, so comparing after the refusal sees what
        the refusing statement saw."""
        row = await self.db.fetchrow(
            """
            SELECT execution_id, status, workflow_id,
                   workflow_id = $2 AND params = coalesce($3::jsonb, 'null'::jsonb) AS same
            FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
            UNION ALL
            SELECT execution_id, 'retired', workflow_id, false FROM retired_executions
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
            LIMIT 1
            """,
            execution_id,
            workflow_id,
            params,
        )
        if row is None:
            return None
        if row["same"]:
            return Existing(row["execution_id"], row["status"])
        return Conflict(row["execution_id"], row["status"], row["workflow_id"])

    # ---------------------------------------------------------------------- reads

    # ---------------------------------------------------------------------- wakes
