"""Fenced step writes and the evidence a stale holder leaves behind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import asyncpg

from app.db import _encode_json as encode_json
from app.store.fencing import INTERRUPT_SQL, rejected
from app.store.group_commit import GroupCommit
from app.store.handle import Handle, StoreConfig, StoreObject
from app.store.retry import RetryingPool
from app.store.types import (
    InvalidEvent,
    Lease,
    StepRecord,
    step_record,
)

# The observation, its comparison with the record, and (on a difference) the
# counter and the event, in one statement: the flag can never disagree with
# the counter or the history. Nothing here writes a step or an outcome.
# $1 execution, $2 step key (NULL: an acknowledgement), $3 token, $4 owner,
# $5 value, $6 error, $7 whether a result was observed at all.
_LATE_OBSERVATION = """
WITH cmp AS (
    SELECT CASE
        WHEN NOT $7::boolean THEN NULL
        WHEN $2::text IS NOT NULL THEN (
            SELECT CASE WHEN s.status = 'completed'
                        THEN $6::jsonb IS NOT NULL
                             OR coalesce(s.value, 'null'::jsonb)
                                IS DISTINCT FROM coalesce($5::jsonb, 'null'::jsonb)
                        ELSE $6::jsonb IS NULL
                             OR (s.error ->> 'name') IS DISTINCT FROM ($6::jsonb ->> 'name')
                   END
            FROM execution_steps s WHERE s.execution_id = $1 AND s.step_key = $2)
        WHEN jsonb_typeof($5::jsonb) = 'object'
             AND $5::jsonb ->> 'acknowledge' IN ('completed', 'failed') THEN (
            SELECT CASE WHEN e.status = 'completed'
                        THEN $5::jsonb ->> 'acknowledge' <> 'completed'
                             OR coalesce(e.outcome -> 'result', 'null'::jsonb)
                                IS DISTINCT FROM coalesce($5::jsonb -> 'result', 'null'::jsonb)
                        ELSE $5::jsonb ->> 'acknowledge' <> 'failed'
                             OR (e.outcome -> 'error' ->> 'name')
                                IS DISTINCT FROM ($6::jsonb ->> 'name')
                   END
            FROM executions e
            WHERE e.execution_id = $1 AND e.status IN ('completed', 'failed'))
    END AS conflict
), obs AS (
    INSERT INTO late_observations
        (execution_id, step_key, token, owner, value, error, conflict)
    SELECT $1, $2, $3, $4, $5, $6, conflict FROM cmp
    RETURNING observation_id, conflict
), counted AS (
    UPDATE executions SET integrity_conflicts = integrity_conflicts + 1
    WHERE execution_id = $1 AND (SELECT conflict FROM obs)
    RETURNING 1
), ev AS (
    INSERT INTO execution_events (execution_id, kind, token, detail)
    SELECT $1, 'integrity_conflict', $3,
           jsonb_build_object('stepKey', $2::text, 'observationId', observation_id)
    FROM obs WHERE conflict
)
SELECT conflict FROM obs
"""


# Failed attempts kept per step (and Retry reasons per execution).
ATTEMPT_HISTORY = 20


# What Postgres cannot store exactly as given (a NaN, a lone surrogate, a
# \u0000 in a string): refused by the JSON encoding, the driver or the server.
_UNSTORABLE = (ValueError, TypeError, asyncpg.DataError)


@dataclass(frozen=True)
class StepWrite:
    """One step result to record under `lease` (value and error as JSON text)."""

    lease: Lease
    step_key: str
    status: str
    value: str | None
    error: str | None
    function_name: str | None
    attempts: int
    position: int | None


@dataclass(frozen=True)
class StepWritten:
    """The fence's answer to one StepWrite: `fenced` False, the token was not
    current and nothing was written; else the step as recorded (by this
    write or an earlier one), with the interrupt the holder must obey."""

    fenced: bool
    record: StepRecord | None


# Every write of a batch in one statement (one array element per write; a
# batch of one is a single write). Each write keeps its own fence: its
# execution's row, with ITS token, still `running`, locked FOR SHARE, so no
# claim comes between any write's check and its insert, and a stale write is
# refused while the rest of the batch commits. Rows are locked in
# execution_id order: two batches never wait for each other in a cycle. A key
# given twice is inserted once, by its first write (the others then read it as
# recorded). Each inserted step appends its 'step_recorded' event, in the
# order the writes were given. One answer row per write, in that order.
_WRITE_STEPS = f"""
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::int[], $9::int[])
        WITH ORDINALITY AS i(execution_id, token, step_key, status, value, error,
                             function_name, attempts, position, ord)
), fence AS (
    SELECT i.ord, {INTERRUPT_SQL}
    FROM input i JOIN executions e
        ON e.execution_id = i.execution_id AND e.token = i.token AND e.status = 'running'
    ORDER BY e.execution_id
    FOR SHARE OF e
), first AS (
    SELECT DISTINCT ON (i.execution_id, i.step_key) i.*
    FROM input i JOIN fence f USING (ord)
    ORDER BY i.execution_id, i.step_key, i.ord
), ins AS (
    INSERT INTO execution_steps
        (execution_id, step_key, status, value, error, function_name, attempts, token, position)
    SELECT execution_id, step_key, status, value::jsonb, error::jsonb, function_name, attempts,
           token, position
    FROM first ORDER BY ord
    ON CONFLICT (execution_id, step_key) DO NOTHING
    RETURNING execution_id, step_key, status, value, error, function_name, attempts, token,
              recorded_at
), ev AS (
    INSERT INTO execution_events (execution_id, kind, token, detail)
    SELECT ins.execution_id, 'step_recorded', ins.token,
           jsonb_build_object('stepKey', ins.step_key, 'status', ins.status)
    FROM ins JOIN first USING (execution_id, step_key)
    ORDER BY first.ord
)
SELECT f.ord IS NOT NULL AS fenced, f.interrupt, ins.step_key, ins.status, ins.value,
       ins.error, ins.function_name, ins.attempts, ins.token, ins.recorded_at
FROM input i
LEFT JOIN fence f USING (ord)
LEFT JOIN first USING (ord)
LEFT JOIN ins ON ins.execution_id = first.execution_id AND ins.step_key = first.step_key
ORDER BY i.ord
"""

# Steps already recorded, by (execution, key): a statement of its own, after
# the write's, so a step recorded concurrently after the write's snapshot is
# read too.
_RECORDED_STEPS = """
SELECT s.execution_id, s.step_key, s.status, s.value, s.error, s.function_name, s.attempts,
       s.token, s.recorded_at
FROM unnest($1::text[], $2::text[]) AS k(execution_id, step_key)
JOIN execution_steps s USING (execution_id, step_key)
"""


def _json(value: Any) -> str | None:
    """As the jsonb codec sends it (None: SQL NULL)."""
    return None if value is None else encode_json(value)


async def write_steps(db: Handle, writes: Sequence[StepWrite]) -> list[StepWritten]:
    """Record `writes` in one statement (_WRITE_STEPS); one answer per write,
    in order. A value Postgres cannot store raises (_UNSTORABLE), and then
    nothing of the batch was written."""
    rows = await db.fetch(
        _WRITE_STEPS,
        [w.lease.execution_id for w in writes],
        [w.lease.token for w in writes],
        [w.step_key for w in writes],
        [w.status for w in writes],
        [w.value for w in writes],
        [w.error for w in writes],
        [w.function_name for w in writes],
        [w.attempts for w in writes],
        [w.position for w in writes],
    )
    assert len(rows) == len(writes)  # the statement answers every write
    # Fenced but not inserted: recorded already (by this holder, an earlier
    # one, or an earlier write of this batch); that step stands, unchanged.
    known = [(w.lease.execution_id, w.step_key) for w, row in zip(writes, rows, strict=True)
             if row["fenced"] and row["step_key"] is None]
    recorded: dict[tuple[str, str], asyncpg.Record] = {}
    if known:
        found = await db.fetch(_RECORDED_STEPS, [k[0] for k in known], [k[1] for k in known])
        recorded = {(r["execution_id"], r["step_key"]): r for r in found}
    answers = []
    for w, row in zip(writes, rows, strict=True):
        if not row["fenced"]:
            answers.append(StepWritten(False, None))
            continue
        if row["step_key"] is not None:
            answers.append(StepWritten(True, step_record(row, row["interrupt"])))
            continue
        existing = recorded.get((w.lease.execution_id, w.step_key))
        assert existing is not None  # recorded: the insert above met it
        answers.append(StepWritten(True, step_record(existing, row["interrupt"])))
    return answers


class Steps(StoreObject):
    def __init__(self, db: Handle, config: StoreConfig) -> None:
        super().__init__(db, config)
        # On the pool, concurrent step writes (a worker's deliveries) go in one
        # statement per batch; in a caller's transaction each write is its own
        # statement, so that it joins the transaction.
        self.step_writes: GroupCommit[StepWrite, StepWritten] | None = (
            GroupCommit(self._flush_step_writes) if isinstance(db, RetryingPool) else None)

    async def write_step(
        self,
        lease: Lease,
        step_key: str,
        *,
        value: Any = None,
        error: dict[str, Any] | None = None,
        function_name: str | None = None,
        attempts: int = 1,
        position: int | None = None,
    ) -> StepRecord:
        """Record a step result under the lease, or return the one already
        recorded (idempotent for the current holder). Stale → LeaseLost.

        FOR SHARE on the execution row conflicts with the claim's row lock:
        either this statement locks first, and a claim skips the row until this
        step has committed (so the next holder sees it), or the claim commits
        first and the token check here re-reads the row and fails. Check and
        insert can never be split by a claim.

        On the pool, writes that arrive while earlier ones are in flight go
        together in the next statement (group commit): each keeps its own
        fence and gets its own answer, and a value that cannot be stored
        fails only its own write (InvalidEvent).
        """
        try:
            write = StepWrite(lease, step_key, "failed" if error is not None else "completed",
                              _json(value), _json(error), function_name, attempts, position)
        except _UNSTORABLE as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        if self.step_writes is None:
            written = await self._write_alone(write)
        else:
            written = await self.step_writes.submit(write)
        if not written.fenced:
            raise await rejected(self.db, lease, step_key)
        assert written.record is not None  # fenced: recorded, now or before
        return written.record

    async def _write_alone(self, write: StepWrite) -> StepWritten:
        try:
            [written] = await write_steps(self.db, [write])
        except _UNSTORABLE as exc:
            raise InvalidEvent(f"step {write.step_key!r}: {exc}") from exc
        return written

    async def _flush_step_writes(
            self, writes: list[StepWrite]) -> list[StepWritten | BaseException]:
        """One batch of the group commit. A value of one write that cannot be
        stored fails the batch's statement (nothing of it written): then each
        write is sent alone, so that only that one gets InvalidEvent."""
        try:
            return list(await write_steps(self.db, writes))
        except _UNSTORABLE as exc:
            if len(writes) == 1:
                return [InvalidEvent(f"step {writes[0].step_key!r}: {exc}")]
        answers: list[StepWritten | BaseException] = []
        for write in writes:
            try:
                answers.append(await self._write_alone(write))
            except Exception as exc:  # this write's answer alone
                answers.append(exc)
        return answers

    async def record_late_observation(
        self,
        lease: Lease,
        step_key: str | None,
        *,
        value: Any = None,
        error: dict[str, Any] | None = None,
        observed: bool | None = None,
    ) -> bool | None:
        """Evidence from a stale holder: appended, never applied to state, and
        compared in the same statement with what was recorded. Returns the
        `conflict` flag: None nothing to compare with, False the same, True
        different (an integrity conflict: the execution's integrity_conflicts
        counter moves and an 'integrity_conflict' event is appended, also in
        the same statement).

        A step observation (`step_key` given) is compared with the recorded
        step of that key: a recorded value with an observed value (JSON
        equality), a recorded failure with an observed error (by error name:
        messages carry times and hosts). An acknowledgement observation
        (`step_key` None, value {"acknowledge": kind, "result": ...}) of kind
        completed/failed is compared the same way with the execution's outcome
        once it is completed/failed; suspensions and policy ends (cancelled,
        timed_out) are not compared.

        `observed`: whether a result was observed at all. None (default): only
        when `value` or `error` is given, so a rejected write that carried no
        result (a start_child, a timer) is not mistaken for a step returning
        None; pass True when None itself was the result.
        """
        if observed is None:
            observed = value is not None or error is not None
        try:
            return cast("bool | None", await self.db.fetchval(
                _LATE_OBSERVATION, lease.execution_id, step_key, lease.token, lease.owner,
                value, error, observed,
            ))
        except (ValueError, TypeError, asyncpg.DataError):
            # Not storable, so not comparable either: kept as evidence of that.
            await self.db.execute(
                _LATE_OBSERVATION, lease.execution_id, step_key, lease.token, lease.owner,
                None, {"name": "UnstorableValue", "message": "the observed value is not valid JSON"},
                False,
            )
            return None

    async def record_timer(
        self,
        lease: Lease,
        step_key: str,
        *,
        delay_seconds: float | None = None,
        until: datetime | None = None,
        position: int | None = None,
    ) -> tuple[datetime, datetime, str | None]:
        """Record a durable timer as a fenced step whose value is the wake time,
        computed from the database clock (`now() + delay`) or given (`until`).
        An already-recorded timer keeps its time. Returns (wake_at, db_now,
        interrupt)."""
        row = await self.db.fetchrow(
            f"""
            WITH fence AS (
                -- Same lock as write_step: no claim between check and insert.
                SELECT execution_id, {INTERRUPT_SQL} FROM executions
                WHERE execution_id = $1 AND token = $2 AND status = 'running'
                FOR SHARE
            ), ins AS (
                INSERT INTO execution_steps
                    (execution_id, step_key, status, value, function_name, token, position)
                SELECT execution_id, $3, 'completed',
                       to_jsonb(coalesce($5::timestamptz, now() + make_interval(secs => $4))),
                       'sleep', $2, $6
                FROM fence
                ON CONFLICT (execution_id, step_key) DO NOTHING
                RETURNING value
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT $1, 'step_recorded', $2,
                       jsonb_build_object('stepKey', $3::text, 'status', 'completed',
                                          'wakeAt', value)
                FROM ins
            )
            SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT interrupt FROM fence) AS interrupt,
                   coalesce((SELECT value FROM ins),
                            (SELECT value FROM execution_steps
                             WHERE execution_id = $1 AND step_key = $3)) AS value,
                   now() AS db_now
            """,
            lease.execution_id,
            lease.token,
            step_key,
            float(delay_seconds or 0.0),
            until,
            position,
        )
        assert row is not None  # the statement always returns its row
        if not row["fenced"]:
            raise await rejected(self.db, lease, step_key)
        if row["value"] is None:  # recorded concurrently after this snapshot
            existing = await self.db.fetchval(
                "SELECT value FROM execution_steps WHERE execution_id = $1 AND step_key = $2",
                lease.execution_id,
                step_key,
            )
            assert existing is not None  # recorded: the insert above met it
            return datetime.fromisoformat(existing), row["db_now"], row["interrupt"]
        return datetime.fromisoformat(row["value"]), row["db_now"], row["interrupt"]

    async def record_attempt(self, lease: Lease, step_key: str, attempt: int,
                             error: dict[str, Any]) -> None:
        """Keep one failed attempt of a step (fenced, like the step write),
        with an `attempt_failed` event; the step's history is trimmed to its
        last ATTEMPT_HISTORY attempts in the same statement."""
        try:
            row = await self.db.fetchrow(
                """
                WITH fence AS (
                    SELECT execution_id FROM executions
                    WHERE execution_id = $1 AND token = $2 AND status = 'running'
                    FOR SHARE
                ), ins AS (
                    INSERT INTO attempt_history (execution_id, step_key, attempt, token, error)
                    SELECT execution_id, $3, $4, $2, $5 FROM fence
                    RETURNING attempt_id
                ), trim AS (
                    DELETE FROM attempt_history
                    WHERE execution_id = $1 AND step_key = $3 AND EXISTS (SELECT 1 FROM ins)
                      AND attempt_id <= (
                          SELECT attempt_id FROM attempt_history
                          WHERE execution_id = $1 AND step_key = $3
                          ORDER BY attempt_id DESC OFFSET $6 - 1 LIMIT 1)
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, token, detail)
                    SELECT $1, 'attempt_failed', $2,
                           jsonb_build_object('stepKey', $3::text, 'attempt', $4::int,
                                              'error', $5::jsonb)
                    FROM ins
                )
                SELECT (SELECT count(*) FROM fence) AS fenced
                """,
                lease.execution_id,
                lease.token,
                step_key,
                attempt,
                error,
                ATTEMPT_HISTORY,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        assert row is not None  # the statement always returns its row
        if not row["fenced"]:
            raise await rejected(self.db, lease, step_key)

