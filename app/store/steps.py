"""Fenced step writes and the evidence a stale holder leaves behind."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

import asyncpg

from app.db import encode_json
from app.dberrors import is_infrastructure
from app.store.buckets import bucket_of
from app.store.fencing import FENCE_CTE, INTERRUPT_SQL, rejected
from app.store.group_commit import GroupCommit, own_copy, settle
from app.store.handle import Handle, StoreConfig, StoreObject
from app.store.on_shard import NEXT_ATTEMPT_ID, NEXT_EVENT_ID, NEXT_OBSERVATION_ID, OnShard
from app.store.placement import SINGLE_NODE, Placement, placement_of, shard_buckets
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
_LATE_OBSERVATION = OnShard("late_observation", f"""
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
            FROM execution_steps s
            WHERE s.execution_id = $1 AND s.bucket = fencepost_bucket($1) AND s.step_key = $2)
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
            WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
              AND e.status IN ('completed', 'failed'))
    END AS conflict
), obs AS (
    INSERT INTO late_observations
        (observation_id, execution_id, bucket, step_key, token, owner, value, error, conflict)
    SELECT {NEXT_OBSERVATION_ID}, $1, fencepost_bucket($1), $2, $3, $4, $5, $6, conflict
    FROM cmp
    RETURNING observation_id, conflict
), counted AS (
    UPDATE executions AS x SET integrity_conflicts = x.integrity_conflicts + 1,
                               event_seq = x.event_seq + 1
    WHERE x.execution_id = $1 AND x.bucket = fencepost_bucket($1) AND (SELECT conflict FROM obs)
    RETURNING x.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), counted.event_seq, 'integrity_conflict',
           $3, jsonb_build_object('stepKey', $2::text, 'observationId', observation_id)
    FROM obs, counted WHERE conflict
)
SELECT conflict FROM obs
""", ("text", "text", "bigint", "text", "jsonb", "jsonb", "boolean"), (("conflict", "boolean"),))


# Failed attempts kept per step (and Retry reasons per execution).
ATTEMPT_HISTORY = 20

# A failed attempt of step $3 kept, fenced (the token checked on the row the
# fence updates), with its event; the step's history trimmed to its last $6
# attempts, all in one statement on the execution's shard.
_RECORD_ATTEMPT = OnShard("record_attempt", f"""
WITH {FENCE_CTE}, ins AS (
    INSERT INTO attempt_history
        (attempt_id, execution_id, bucket, step_key, attempt, token, error)
    SELECT {NEXT_ATTEMPT_ID}, execution_id, fencepost_bucket(execution_id), $3, $4, $2, $5
    FROM fence
    RETURNING attempt_id
), trim AS (
    DELETE FROM attempt_history AS h
    WHERE h.execution_id = $1 AND h.bucket = fencepost_bucket($1) AND h.step_key = $3
      AND EXISTS (SELECT 1 FROM ins)
      AND h.attempt_id <= (
          SELECT k.attempt_id FROM attempt_history k
          WHERE k.execution_id = $1 AND k.bucket = fencepost_bucket($1)
            AND k.step_key = $3
          ORDER BY k.attempt_id DESC OFFSET $6 - 1 LIMIT 1)
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), (SELECT event_seq FROM fence),
           'attempt_failed', $2,
           jsonb_build_object('stepKey', $3::text, 'attempt', $4::int, 'error', $5::jsonb)
    FROM ins
)
SELECT (SELECT count(*) FROM fence) AS fenced
""", ("text", "bigint", "text", "integer", "jsonb", "integer"), (("fenced", "bigint"),))



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
    current and nothing was written (`skipped` True: not known yet, its
    execution row was held by another transaction, see _FENCED_INPUT); else
    the step as recorded (by this write or an earlier one), with the
    interrupt the holder must obey."""

    fenced: bool
    record: StepRecord | None
    skipped: bool = False


@dataclass(frozen=True)
class TimerWrite:
    """A durable timer to record under `lease`: wake `delay_seconds` after the
    database's now, or at `until` when given."""

    lease: Lease
    step_key: str
    delay_seconds: float
    until: datetime | None
    position: int | None


@dataclass(frozen=True)
class TimerWritten:
    """The fence's answer to one TimerWrite: `fenced` False, nothing written
    (`skipped` as for StepWritten); else the recorded wake time (None: recorded after the statement's
    snapshot, to be read), the database's now and the interrupt."""

    fenced: bool
    interrupt: str | None
    wake_at: str | None
    db_now: datetime
    skipped: bool = False


# The fence of a batch of writes, `input` (one row per write, numbered `ord`;
# $1 the writes' execution IDs). Where it is atomic: `locked` takes each
# execution row of the batch FOR NO KEY UPDATE (`placed` writes the events'
# places on it), once, while it is still `running`
# (re-checked on the row's latest version if it changed since the
# statement's snapshot), and holds it to commit; `fence` then compares each
# write's token with that locked row. A claim must lock the row FOR UPDATE to
# move the token, so none comes between a write's check and its insert; each
# write keeps its own token, and a stale one is refused while the rest of the
# batch commits. `first`: the fenced writes, a key given twice only once, by
# its first write (the others then find it recorded).
#
# {skip}: in a batch, SKIP LOCKED: a row another transaction holds (an
# operator's cancel, a bulk update, a renewal, a claim) must not hold back
# every other write of the batch. Such a row is not locked, so none of its
# writes is fenced or written (each row is locked once: all writes of one
# execution are fenced together or skipped together, so their order and a
# repeated key's first write are kept); `skipped` says so (its token and status still
# matched in the statement's snapshot: not a refusal), and each is written
# again by this statement without SKIP LOCKED, which waits for the row as a
# single write always did and checks the token again. Without SKIP LOCKED,
# rows are locked in execution_id order: two statements never wait for each
# other in a cycle.
_FENCED_INPUT = """
locked AS (
    SELECT e.execution_id, e.token, {interrupt}
    FROM executions e
    -- Citus: a batch spans buckets.
    WHERE e.execution_id = ANY($1::text[]) AND e.status = 'running'
    ORDER BY e.execution_id
    FOR NO KEY UPDATE OF e {skip}
), fence AS (
    SELECT i.ord, l.interrupt
    FROM input i JOIN locked l ON l.execution_id = i.execution_id AND l.token = i.token
), first AS (
    SELECT DISTINCT ON (i.execution_id, i.step_key) i.*
    FROM input i JOIN fence f USING (ord)
    ORDER BY i.execution_id, i.step_key, i.ord
), placed AS (
    -- The places of the fenced writes' events in their histories, taken on
    -- the rows `locked` holds: `base` + 1.. in the order the writes were given.
    UPDATE executions e SET event_seq = e.event_seq + n.writes
    FROM (SELECT execution_id, count(*) AS writes FROM first GROUP BY execution_id) n
    WHERE e.execution_id = n.execution_id AND e.bucket = fencepost_bucket(n.execution_id)
    RETURNING e.execution_id, e.event_seq - n.writes AS base
)"""

# Per answer row (input `i`, fence `f`): a write neither fenced nor refused,
# its execution row not locked by `locked` (see _FENCED_INPUT).
_SKIPPED = """
f.ord IS NULL
    AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.execution_id = i.execution_id)
    AND EXISTS (SELECT 1 FROM executions e
                WHERE e.execution_id = i.execution_id
                  AND e.bucket = fencepost_bucket(i.execution_id) AND e.token = i.token
                  AND e.status = 'running') AS skipped"""

# Every step write of a batch in one statement (one array element per write;
# a batch of one is a single write), fenced as above. Each inserted step
# appends its 'step_recorded' event, in the order the writes were given. One
# answer row per write, in that order.
_WRITE_STEPS = """
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::int[], $9::int[])
        WITH ORDINALITY AS i(execution_id, token, step_key, status, value, error,
                             function_name, attempts, position, ord)
), {fenced_input}, ins AS (
    INSERT INTO execution_steps
        (execution_id, bucket, step_key, status, value, error, function_name, attempts, token,
         position)
    SELECT execution_id, fencepost_bucket(execution_id), step_key, status, value::jsonb,
           error::jsonb, function_name, attempts, token, position
    FROM first ORDER BY ord
    ON CONFLICT (execution_id, step_key, bucket) DO NOTHING
    RETURNING execution_id, step_key, status, value, error, function_name, attempts, token,
              recorded_at
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {next_event_id}, ins.execution_id, fencepost_bucket(ins.execution_id),
           p.base + row_number() OVER (PARTITION BY ins.execution_id ORDER BY first.ord),
           'step_recorded', ins.token,
           jsonb_build_object('stepKey', ins.step_key, 'status', ins.status)
    FROM ins JOIN first USING (execution_id, step_key) JOIN placed p USING (execution_id)
    ORDER BY first.ord
)
SELECT f.ord IS NOT NULL AS fenced, f.interrupt, ins.step_key, ins.status, ins.value,
       ins.error, ins.function_name, ins.attempts, ins.token, ins.recorded_at, {skipped}
FROM input i
LEFT JOIN fence f USING (ord)
LEFT JOIN first USING (ord)
LEFT JOIN ins ON ins.execution_id = first.execution_id AND ins.step_key = first.step_key
ORDER BY i.ord
"""

# Every timer of a batch in one statement, fenced as above: a timer is a step
# whose value is its wake time, from the database clock (`now() + delay`) or
# given (`until`); its 'step_recorded' event carries the wake time. An already
# recorded timer keeps its time (the answer's `value`; NULL when it was
# recorded after this statement's snapshot, by a concurrent write or an
# earlier write of this batch). One answer row per timer, in order.
_RECORD_TIMERS = """
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::float8[],
                         $5::timestamptz[], $6::int[])
        WITH ORDINALITY AS i(execution_id, token, step_key, delay, until, position, ord)
), {fenced_input}, ins AS (
    INSERT INTO execution_steps
        (execution_id, bucket, step_key, status, value, function_name, token, position)
    SELECT execution_id, fencepost_bucket(execution_id), step_key, 'completed',
           to_jsonb(coalesce(until, now() + make_interval(secs => delay))), 'sleep', token,
           position
    FROM first ORDER BY ord
    ON CONFLICT (execution_id, step_key, bucket) DO NOTHING
    RETURNING execution_id, step_key, value, token
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {next_event_id}, ins.execution_id, fencepost_bucket(ins.execution_id),
           p.base + row_number() OVER (PARTITION BY ins.execution_id ORDER BY first.ord),
           'step_recorded', ins.token,
           jsonb_build_object('stepKey', ins.step_key, 'status', 'completed',
                              'wakeAt', ins.value)
    FROM ins JOIN first USING (execution_id, step_key) JOIN placed p USING (execution_id)
    ORDER BY first.ord
)
SELECT f.ord IS NOT NULL AS fenced, f.interrupt, coalesce(ins.value, s.value) AS value,
       now() AS db_now, {skipped}
FROM input i
LEFT JOIN fence f USING (ord)
LEFT JOIN first USING (ord)
LEFT JOIN ins ON ins.execution_id = first.execution_id AND ins.step_key = first.step_key
LEFT JOIN execution_steps s
    ON f.ord IS NOT NULL AND s.execution_id = i.execution_id
   AND s.bucket = fencepost_bucket(i.execution_id) AND s.step_key = i.step_key
ORDER BY i.ord
"""



def _statements(template: str) -> dict[bool, str]:
    """`template` waiting for held rows (False) and skipping them (True)."""
    return {skip_locked: template.format(
        fenced_input=_FENCED_INPUT.format(interrupt=INTERRUPT_SQL,
                                          skip="SKIP LOCKED" if skip_locked else ""),
        skipped=_SKIPPED, next_event_id=NEXT_EVENT_ID) for skip_locked in (False, True)}


_STEP_ANSWER = (("fenced", "boolean"), ("interrupt", "text"), ("step_key", "text"),
                ("status", "text"), ("value", "jsonb"), ("error", "jsonb"),
                ("function_name", "text"), ("attempts", "integer"), ("token", "bigint"),
                ("recorded_at", "timestamptz"), ("skipped", "boolean"))
_WRITE_STEPS_BY_SKIP = {
    skip: OnShard(f"write_steps{'_skip_locked' if skip else ''}", sql,
                  ("text[]", "bigint[]", "text[]", "text[]", "text[]", "text[]", "text[]",
                   "integer[]", "integer[]"), _STEP_ANSWER)
    for skip, sql in _statements(_WRITE_STEPS).items()}
_RECORD_TIMERS_BY_SKIP = {
    skip: OnShard(f"record_timers{'_skip_locked' if skip else ''}", sql,
                  ("text[]", "bigint[]", "text[]", "float8[]", "timestamptz[]", "integer[]"),
                  (("fenced", "boolean"), ("interrupt", "text"), ("value", "jsonb"),
                   ("db_now", "timestamptz"), ("skipped", "boolean")))
    for skip, sql in _statements(_RECORD_TIMERS).items()}

# Steps already recorded, by (execution, key): a statement of its own, after
# the write's, so a step recorded concurrently after the write's snapshot is
# read too.
_RECORDED_STEPS = OnShard("recorded_steps", """
SELECT s.execution_id, s.step_key, s.status, s.value, s.error, s.function_name, s.attempts,
       s.token, s.recorded_at
FROM unnest($1::text[], $2::text[]) AS k(execution_id, step_key)
JOIN execution_steps s
  ON s.execution_id = k.execution_id AND s.bucket = fencepost_bucket(k.execution_id)
 AND s.step_key = k.step_key
""", ("text[]", "text[]"), (
    ("execution_id", "text"), ("step_key", "text"), ("status", "text"), ("value", "jsonb"),
    ("error", "jsonb"), ("function_name", "text"), ("attempts", "integer"),
    ("token", "bigint"), ("recorded_at", "timestamptz")))


def _json(value: Any) -> str | None:
    """As the jsonb codec sends it (None: SQL NULL)."""
    return None if value is None else encode_json(value)


async def write_steps(db: Handle, writes: Sequence[StepWrite], *,
                      skip_locked: bool = False,
                      placement: Placement = SINGLE_NODE) -> list[StepWritten]:
    """Record `writes` in one statement (_WRITE_STEPS); one answer per write,
    in order. A value Postgres cannot store raises (_UNSTORABLE), and then
    nothing of the batch was written. `skip_locked`: writes whose execution
    row another transaction holds are answered `skipped`, not waited for.
    On Citus: one statement per shard the writes are in, each on its shard."""
    return await placement.per_shard(
        writes, lambda w: w.lease.execution_id,
        lambda part, buckets: _write_steps(db, part, skip_locked, buckets),
        at_once=isinstance(db, RetryingPool))


async def _write_steps(db: Handle, writes: Sequence[StepWrite], skip_locked: bool,
                       buckets: list[int] | None) -> list[StepWritten]:
    rows = await _WRITE_STEPS_BY_SKIP[skip_locked].fetch(
        db, buckets,
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
        found = await _RECORDED_STEPS.fetch(db, buckets and [bucket_of(k[0]) for k in known],
                                            [k[0] for k in known],
                                            [k[1] for k in known])
        recorded = {(r["execution_id"], r["step_key"]): r for r in found}
    answers = []
    for w, row in zip(writes, rows, strict=True):
        if not row["fenced"]:
            answers.append(StepWritten(False, None, skipped=row["skipped"]))
            continue
        if row["step_key"] is not None:
            answers.append(StepWritten(True, step_record(row, row["interrupt"])))
            continue
        existing = recorded.get((w.lease.execution_id, w.step_key))
        assert existing is not None  # recorded: the insert above met it
        answers.append(StepWritten(True, step_record(existing, row["interrupt"])))
    return answers


async def record_timers(db: Handle, timers: Sequence[TimerWrite], *,
                        skip_locked: bool = False,
                        placement: Placement = SINGLE_NODE) -> list[TimerWritten]:
    """Record `timers` in one statement (_RECORD_TIMERS); one answer per
    timer. `skip_locked` as for write_steps; on Citus, as write_steps, one
    statement per shard the timers are in, each on its shard."""
    return await placement.per_shard(
        timers, lambda t: t.lease.execution_id,
        lambda part, buckets: _record_timers(db, part, skip_locked, buckets),
        at_once=isinstance(db, RetryingPool))


async def _record_timers(db: Handle, timers: Sequence[TimerWrite], skip_locked: bool,
                         buckets: list[int] | None) -> list[TimerWritten]:
    rows = await _RECORD_TIMERS_BY_SKIP[skip_locked].fetch(
        db, buckets,
        [t.lease.execution_id for t in timers],
        [t.lease.token for t in timers],
        [t.step_key for t in timers],
        [t.delay_seconds for t in timers],
        [t.until for t in timers],
        [t.position for t in timers],
    )
    assert len(rows) == len(timers)  # the statement answers every timer
    return [TimerWritten(r["fenced"], r["interrupt"], r["value"], r["db_now"], r["skipped"])
            for r in rows]


class _Fenced(Protocol):
    @property
    def lease(self) -> Lease: ...


class _MaySkip(Protocol):
    @property
    def skipped(self) -> bool: ...


Item = TypeVar("Item")
Answer = TypeVar("Answer")
Write = TypeVar("Write", bound=_Fenced)
Written = TypeVar("Written", bound=_MaySkip)


@dataclass(frozen=True)
class Later(Generic[Written]):
    """A batch's answer for a write whose execution row another transaction
    held: the write, done again after the batch (waiting for that row), will
    answer here."""

    answer: asyncio.Future[Written]


@dataclass(frozen=True)
class Submitted(Generic[Write, Written]):
    """A write as its caller submits it to a group commit, with the future
    its Later answer goes to: the caller's own, so that it is cancelled when
    the caller stops waiting, even before its batch answered."""

    write: Write
    answer: asyncio.Future[Written]

    @property
    def lease(self) -> Lease:
        return self.write.lease


async def _submit(commit: GroupCommit[Submitted[Write, Written], Written | Later[Written]],
                  write: Write) -> Written:
    """`write`'s answer from its group commit, now or Later."""
    answer: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
    try:
        batched = await commit.submit(Submitted(write, answer))
        return await batched.answer if isinstance(batched, Later) else batched
    finally:
        # Answered: nothing to do. Cancelled (the delivery stopped): its
        # held write, if any, is not written for it any more.
        answer.cancel()


def _cancel_when_no_caller_waits(task: asyncio.Task[None],
                                 answers: list[asyncio.Future[Written]],
                                 _: object = None) -> None:
    """A held write whose callers all stopped waiting is cancelled: its
    statement, waiting for the row, is cancelled by the server and rolls
    back (its writes commit with their tokens or not at all), and its
    connection goes back to the pool at once instead of waiting for the
    row's holder. The task sets its answers and ends in one step, so when
    every answer is done and the task is not, only callers have left."""
    if not task.done() and all(f.done() for f in answers):
        task.cancel()


async def batch_or_each_alone(
        write: Callable[[Sequence[Item]], Awaitable[list[Answer]]],
        items: list[Item]) -> list[Answer | BaseException]:
    """One batch of a group commit: `write(items)` in one statement. An error
    of one item's own (a value Postgres cannot store, a key too long for its
    index) fails the whole statement (nothing of it written): then each item
    is written alone, so that only that one fails (its answer is its own
    exception). The database failing is every item's error."""
    try:
        return list(await write(items))
    except Exception as exc:
        if len(items) == 1 or is_infrastructure(exc):
            raise
    answers: list[Answer | BaseException] = []
    for item in items:
        try:
            [answer] = await write([item])
        except Exception as exc:  # this item's answer alone
            answers.append(exc)
        else:
            answers.append(answer)
    return answers


async def _write_held(write: Callable[[Sequence[Write]], Awaitable[list[Written]]],
                      items: list[Write], answers: list[asyncio.Future[Written]]) -> None:
    """The writes of ONE execution that a batch skipped, written again in one
    statement that waits for the row (in the order they were submitted, so
    that order is kept), each answer to its future."""
    try:
        written = await batch_or_each_alone(write, items)
    except asyncio.CancelledError:  # the writer's loop is ending
        for future in answers:
            future.cancel()
        raise
    except Exception as exc:  # every one's: nothing of them committed
        written = [own_copy(exc) for _ in items]
    settle(answers, written)


class Steps(StoreObject):
    def __init__(self, db: Handle, config: StoreConfig) -> None:
        super().__init__(db, config)
        # On the pool, concurrent step writes and timers (a worker's
        # deliveries) go in one statement per batch of each kind; in a
        # caller's transaction each is its own statement, so that it joins
        # the transaction.
        self.step_writes: GroupCommit[Submitted[StepWrite, StepWritten],
                                      StepWritten | Later[StepWritten]] | None = None
        self.timer_writes: GroupCommit[Submitted[TimerWrite, TimerWritten],
                                       TimerWritten | Later[TimerWritten]] | None = None
        # Writes skipped by a batch, being written again (held here: the
        # loop keeps only a weak reference to a task). Each is cancelled
        # when all its callers stopped waiting, or by cancel_held_writes.
        self.held_writes: set[asyncio.Task[None]] = set()
        if isinstance(db, RetryingPool):
            self.step_writes = GroupCommit(self.flush_step_writes)
            self.timer_writes = GroupCommit(self.flush_timers)

    async def _write_steps(self, writes: Sequence[StepWrite], *,
                           skip_locked: bool = False) -> list[StepWritten]:
        return await write_steps(self.db, writes, skip_locked=skip_locked,
                                 placement=await placement_of(self.db, self.config.placement))

    async def _record_timers(self, timers: Sequence[TimerWrite], *,
                             skip_locked: bool = False) -> list[TimerWritten]:
        return await record_timers(self.db, timers, skip_locked=skip_locked,
                                   placement=await placement_of(self.db, self.config.placement))

    async def flush_step_writes(
            self, submitted: list[Submitted[StepWrite, StepWritten]],
    ) -> list[StepWritten | Later[StepWritten] | BaseException]:
        """One batch of step writes (the group commit's flush)."""
        answers = await batch_or_each_alone(
            partial(self._write_steps, skip_locked=True), [s.write for s in submitted])
        return self.later_if_skipped(self._write_steps, submitted, answers)

    async def flush_timers(
            self, submitted: list[Submitted[TimerWrite, TimerWritten]],
    ) -> list[TimerWritten | Later[TimerWritten] | BaseException]:
        """One batch of timers (the group commit's flush)."""
        answers = await batch_or_each_alone(
            partial(self._record_timers, skip_locked=True), [s.write for s in submitted])
        return self.later_if_skipped(self._record_timers, submitted, answers)

    def later_if_skipped(
            self, write: Callable[[Sequence[Write]], Awaitable[list[Written]]],
            submitted: Sequence[Submitted[Write, Written]],
            answers: list[Written | BaseException],
    ) -> list[Written | Later[Written] | BaseException]:
        """A batch's answers, each write its batch skipped (its execution row
        was held) answered Later: written again at once, alone with the other
        skipped writes of its execution, by `write`, which waits for the row.
        The batch's other answers go back now, not after that wait. That
        statement is cancelled once none of its callers waits any more."""
        loop = asyncio.get_running_loop()
        held: defaultdict[str, list[Submitted[Write, Written]]] = defaultdict(list)
        out: list[Written | Later[Written] | BaseException] = []
        for item, answer in zip(submitted, answers, strict=True):
            if isinstance(answer, BaseException) or not answer.skipped:
                out.append(answer)
                continue
            held[item.lease.execution_id].append(item)
            out.append(Later(item.answer))
        for items in held.values():
            futures = [i.answer for i in items]
            task = loop.create_task(_write_held(write, [i.write for i in items], futures))
            self.held_writes.add(task)
            task.add_done_callback(self.held_writes.discard)
            stop = partial(_cancel_when_no_caller_waits, task, futures)
            for future in futures:  # a caller already gone: called at once
                future.add_done_callback(stop)
        return out

    async def cancel_held_writes(self) -> None:
        """Cancel every write still waiting for a held row, and wait until
        they ended (a worker stopping: none of its deliveries waits any
        more). Each statement rolls back and its connection goes back to
        the pool, so closing the pool does not wait for the row's holder."""
        tasks = list(self.held_writes)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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

        The lock on the execution row conflicts with the claim's row lock:
        either this statement locks first, and a claim skips the row until this
        step has committed (so the next holder sees it), or the claim commits
        first and the token check here re-reads the row and fails. Check and
        insert can never be split by a claim.

        On the pool, writes that arrive while earlier ones are in flight go
        together in the next statement (group commit): each keeps its own
        fence and gets its own answer, and a value that cannot be stored
        fails only its own write (InvalidEvent). A batch does not wait for an
        execution row another transaction holds: that row's writes are done
        again after it, waiting for the row, and answered then (Later).
        """
        try:
            write = StepWrite(lease, step_key, "failed" if error is not None else "completed",
                              _json(value), _json(error), function_name, attempts, position)
            if self.step_writes is None:
                [written] = await self._write_steps([write])
            else:
                written = await _submit(self.step_writes, write)
        except _UNSTORABLE as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        if not written.fenced:
            raise await rejected(self, lease, step_key)
        assert written.record is not None  # fenced: recorded, now or before
        return written.record

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
        buckets = await shard_buckets(self, lease.execution_id)
        try:
            [row] = await _LATE_OBSERVATION.fetch(
                self.db, buckets, lease.execution_id, step_key, lease.token, lease.owner,
                value, error, observed)
            return cast("bool | None", row["conflict"])
        except (ValueError, TypeError, asyncpg.DataError):
            # Not storable, so not comparable either: kept as evidence of that.
            await _LATE_OBSERVATION.fetch(
                self.db, buckets, lease.execution_id, step_key, lease.token, lease.owner,
                None, {"name": "UnstorableValue", "message": "the observed value is not valid JSON"},
                False)
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
        interrupt). On the pool, timers are group-committed like step writes
        (a held execution row waited for by its own timers only)."""
        timer = TimerWrite(lease, step_key, float(delay_seconds or 0.0), until, position)
        if self.timer_writes is None:
            [written] = await self._record_timers([timer])
        else:
            written = await _submit(self.timer_writes, timer)
        if not written.fenced:
            raise await rejected(self, lease, step_key)
        wake_at = written.wake_at
        if wake_at is None:  # recorded after the statement's snapshot
            wake_at = await self.db.fetchval(
                "SELECT value FROM execution_steps "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2",
                lease.execution_id,
                step_key,
            )
            assert wake_at is not None  # recorded: the insert above met it
        return datetime.fromisoformat(wake_at), written.db_now, written.interrupt

    async def record_attempt(self, lease: Lease, step_key: str, attempt: int,
                             error: dict[str, Any]) -> None:
        """Keep one failed attempt of a step (fenced, like the step write),
        with an `attempt_failed` event; the step's history is trimmed to its
        last ATTEMPT_HISTORY attempts in the same statement."""
        try:
            [row] = await _RECORD_ATTEMPT.fetch(
                self.db, await shard_buckets(self, lease.execution_id), lease.execution_id,
                lease.token, step_key, attempt, error, ATTEMPT_HISTORY)
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        if not row["fenced"]:
            raise await rejected(self, lease, step_key)

