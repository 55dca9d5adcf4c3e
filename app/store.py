"""ExecutionStore: every statement that touches the execution tables.

The API, the worker and the maintenance services call these methods and never
build SQL of their own. Rules the statements keep (DESIGN.md, RFC 001/002):

* The database clock is the only clock: every time is `now()` in SQL.
* A transition is conditional on the state it leaves; matching no row is a
  lost race, reported as an answer (`LeaseLost`, `ignored`), never guessed.
* Fenced writes (step write, acknowledge, renew, release) check the token and
  write in one statement, under the execution row's lock.
* Each transition appends its event in the same statement, so the history
  can never disagree with the record.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.schema import TERMINAL_STATUSES

NOTIFY_CHANNEL = "fencepost_due"


class LeaseLost(Exception):
    """A fenced write carried a token that is no longer current, or the lease
    was already ended. Nothing was written; the delivery must stop."""

    def __init__(self, execution_id: str, token: int):
        super().__init__(f"lease on {execution_id} with token {token} is no longer current")
        self.execution_id = execution_id
        self.token = token


class InvalidEvent(Exception):
    """Params or context that Postgres cannot store exactly as given."""


@dataclass(frozen=True)
class Lease:
    execution_id: str
    token: int
    expires_at: datetime
    owner: str


@dataclass(frozen=True)
class Delivery:
    """A claim, with the record prefetched so the worker needs no second read."""

    lease: Lease
    workflow_id: str
    params: Any
    context: dict
    status_before: str
    outcome: dict | None
    unacknowledged_deliveries: int
    deadline: datetime | None
    code_version: str | None


@dataclass(frozen=True)
class Admitted:
    execution_id: str
    status: str


@dataclass(frozen=True)
class Conflict:
    execution_id: str
    status: str
    workflow_id: str


@dataclass(frozen=True)
class StepRecord:
    step_key: str
    status: str
    value: Any
    error: dict | None
    function_name: str | None
    attempts: int
    token: int
    recorded_at: datetime


@dataclass(frozen=True)
class Acknowledged:
    status: str
    outcome: dict | None


@dataclass(frozen=True)
class ReapResult:
    expired: int
    execution_ids: list[str]


WakeAnswer = Literal["requested", "ignored", "not_found"]

_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in TERMINAL_STATUSES) + ")"

# Reads heal lazily: a running record whose lease has expired is reported as
# the reaper will leave it (status back, counter +1, pending wakes merged,
# redelivery delay from the expiry) before the reaper has written it.
# $1 = redelivery base seconds, $2 = cap seconds.
_RECORD_COLUMNS = """
    execution_id, workflow_id, params, context, code_version, outcome,
    admitted_at, updated_at, token, deadline, cancel_requested_at,
    parked_reason, parked_step, ever_suspended,
    (status = 'running' AND lease_expires_at <= now()) AS lease_expired,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END
         ELSE status END AS status,
    unacknowledged_deliveries
        + (status = 'running' AND lease_expires_at <= now())::int AS unacknowledged_deliveries,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN least(due_at, covered_due_at) ELSE due_at END AS due_at,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN lease_expires_at ELSE last_unacknowledged_at END AS last_unacknowledged_at,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN lease_expires_at
              + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $1, $2)
         ELSE redeliver_after END AS redeliver_after,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_owner END AS lease_owner,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_expires_at END
        AS lease_expires_at,
    now() AS read_at
"""


def _encode_cursor(admitted_at: datetime, execution_id: str) -> str:
    raw = json.dumps([admitted_at.isoformat(), execution_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError for a cursor this store did not issue."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, execution_id = json.loads(raw)
        return datetime.fromisoformat(at), str(execution_id)
    except Exception as exc:  # any malformed cursor is the caller's mistake
        raise ValueError("cursor is not one this server issued") from exc


def _step(row: asyncpg.Record) -> StepRecord:
    return StepRecord(
        step_key=row["step_key"],
        status=row["status"],
        value=row["value"],
        error=row["error"],
        function_name=row["function_name"],
        attempts=row["attempts"],
        token=row["token"],
        recorded_at=row["recorded_at"],
    )


class ExecutionStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        redelivery_base_seconds: float = 1.0,
        redelivery_cap_seconds: float = 300.0,
    ):
        self.pool = pool
        self.redelivery_base = float(redelivery_base_seconds)
        self.redelivery_cap = float(redelivery_cap_seconds)

    @classmethod
    def from_settings(cls, pool: asyncpg.Pool, settings) -> ExecutionStore:
        return cls(
            pool,
            redelivery_base_seconds=settings.redelivery_base_seconds,
            redelivery_cap_seconds=settings.redelivery_cap_seconds,
        )

    # ------------------------------------------------------------------ admission

    async def admit(
        self,
        *,
        workflow_id: str,
        params: Any,
        context: dict | None = None,
        execution_id: str | None = None,
        deadline: datetime | None = None,
        code_version: str | None = None,
    ) -> Admitted | Conflict:
        """Record the execution and its first wake (due now) in one statement,
        or report the record that already holds the ID. IDs are never reused."""
        execution_id = execution_id or str(uuid.uuid4())
        try:
            row = await self.pool.fetchrow(
                f"""
                WITH ins AS (
                    INSERT INTO executions
                        (execution_id, workflow_id, params, context, status, due_at,
                         deadline, code_version)
                    VALUES ($1, $2, $3, $4, 'admitted', now(), $5, $6)
                    ON CONFLICT (execution_id) DO NOTHING
                    RETURNING execution_id, status
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, detail)
                    SELECT execution_id, 'admitted', jsonb_build_object('workflowId', $2::text)
                    FROM ins
                )
                -- NOTIFY is delivered on commit, so idle workers start at once.
                SELECT execution_id, status, pg_notify('{NOTIFY_CHANNEL}', '') FROM ins
                """,
                execution_id,
                workflow_id,
                params,
                context if context is not None else {},
                deadline,
                code_version,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            # NaN/Infinity (the encoder refuses them), \u0000 and lone
            # surrogates (jsonb refuses them): nothing was stored.
            raise InvalidEvent(str(exc)) from exc
        if row is not None:
            return Admitted(row["execution_id"], row["status"])
        existing = await self.pool.fetchrow(
            "SELECT execution_id, status, workflow_id FROM executions WHERE execution_id = $1",
            execution_id,
        )
        if existing is None:  # deleted between the two statements; try once more
            return await self.admit(
                workflow_id=workflow_id,
                params=params,
                context=context,
                execution_id=execution_id,
                deadline=deadline,
                code_version=code_version,
            )
        return Conflict(existing["execution_id"], existing["status"], existing["workflow_id"])

    # ---------------------------------------------------------------------- reads

    async def get(self, execution_id: str) -> dict | None:
        row = await self.pool.fetchrow(
            f"SELECT {_RECORD_COLUMNS} FROM executions WHERE execution_id = $3",
            self.redelivery_base,
            self.redelivery_cap,
            execution_id,
        )
        return dict(row) if row is not None else None

    async def list(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        min_unacknowledged_deliveries: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> tuple[list[dict], str | None]:
        """Newest first, keyset-paginated on (admitted_at, execution_id).
        Filters apply to the healed view, as `get` reports it."""
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        rows = await self.pool.fetch(
            f"""
            SELECT * FROM (SELECT {_RECORD_COLUMNS} FROM executions
                           WHERE ($4::text IS NULL OR workflow_id = $4)
                             AND ($6::timestamptz IS NULL
                                  OR (admitted_at, execution_id) < ($6, $7::text))) r
            WHERE ($3::text IS NULL OR r.status = $3)
              AND ($5::int IS NULL OR r.unacknowledged_deliveries >= $5)
            ORDER BY admitted_at DESC, execution_id DESC
            LIMIT $8
            """,
            self.redelivery_base,
            self.redelivery_cap,
            status,
            workflow_id,
            min_unacknowledged_deliveries,
            after_at,
            after_id,
            limit + 1,
        )
        page = [dict(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = _encode_cursor(last["admitted_at"], last["execution_id"])
        return page, next_cursor

    async def steps(self, execution_ids: list[str]) -> dict[str, dict[str, StepRecord]]:
        """Recorded steps of several executions in one round trip."""
        rows = await self.pool.fetch(
            """
            SELECT execution_id, step_key, status, value, error, function_name, attempts,
                   token, recorded_at
            FROM execution_steps WHERE execution_id = ANY($1::text[])
            """,
            execution_ids,
        )
        out: dict[str, dict[str, StepRecord]] = {eid: {} for eid in execution_ids}
        for row in rows:
            out[row["execution_id"]][row["step_key"]] = _step(row)
        return out

    async def events(self, execution_id: str) -> list[dict]:
        rows = await self.pool.fetch(
            """
            SELECT event_id, at, kind, token, detail FROM execution_events
            WHERE execution_id = $1 ORDER BY event_id
            """,
            execution_id,
        )
        return [dict(r) for r in rows]

    async def late_observations(self, execution_id: str) -> list[dict]:
        rows = await self.pool.fetch(
            """
            SELECT observation_id, step_key, token, owner, value, error, observed_at
            FROM late_observations WHERE execution_id = $1 ORDER BY observation_id
            """,
            execution_id,
        )
        return [dict(r) for r in rows]

    # ---------------------------------------------------------------------- wakes

    async def request_wake(self, execution_id: str, at: datetime | None = None) -> WakeAnswer:
        """Unfenced: an extra wake costs at most one extra delivery. Pending
        wakes merge to the earliest; during a delivery they stay apart from the
        wakes the claim covers (due_at vs covered_due_at)."""
        row = await self.pool.fetchrow(
            f"""
            WITH w AS (
                UPDATE executions
                SET due_at = least(due_at, coalesce($2::timestamptz, now())), updated_at = now()
                WHERE execution_id = $1 AND status NOT IN {_TERMINAL_SQL}
                RETURNING execution_id, due_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, detail)
                SELECT execution_id, 'wake_requested',
                       jsonb_build_object('at', coalesce($2::timestamptz, now()))
                FROM w
            )
            SELECT execution_id,
                   CASE WHEN due_at <= now() THEN pg_notify('{NOTIFY_CHANNEL}', '') END
            FROM w
            """,
            execution_id,
            at,
        )
        if row is not None:
            return "requested"
        exists = await self.pool.fetchval(
            "SELECT true FROM executions WHERE execution_id = $1", execution_id
        )
        return "ignored" if exists else "not_found"

    # --------------------------------------------------------------------- leases

    async def claim_due(self, limit: int, duration: float, owner: str) -> list[Delivery]:
        """Lease at most `limit` due executions in one statement.

        Candidates are due admitted/suspended rows past their redelivery delay,
        and running rows whose lease expired (and whose redelivery delay since
        that expiry has passed). FOR UPDATE SKIP LOCKED makes concurrent claims
        take disjoint rows, so an execution never has two live leases; the
        token increment makes every earlier holder stale.
        """
        if limit <= 0:
            return []
        rows = await self.pool.fetch(
            """
            WITH due AS (
                SELECT execution_id, 'due'::text AS how, NULL::text AS old_owner,
                       NULL::timestamptz AS old_expiry
                FROM executions
                WHERE status IN ('admitted', 'suspended') AND due_at <= now()
                  AND (redeliver_after IS NULL OR redeliver_after <= now())
                ORDER BY due_at
                LIMIT $1
                FOR UPDATE SKIP LOCKED
            ), expired AS (
                SELECT execution_id, 'expired'::text AS how, lease_owner AS old_owner,
                       lease_expires_at AS old_expiry
                FROM executions
                WHERE status = 'running' AND lease_expires_at <= now()
                  AND lease_expires_at
                      + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $4, $5) <= now()
                ORDER BY lease_expires_at
                LIMIT $1
                FOR UPDATE SKIP LOCKED
            ), picked AS (
                SELECT * FROM due UNION ALL SELECT * FROM expired LIMIT $1
            ), claimed AS (
                UPDATE executions e
                SET status = 'running',
                    token = e.token + 1,
                    lease_owner = $3,
                    lease_expires_at = now() + make_interval(secs => $2),
                    -- A lease taken over after expiry ended unacknowledged: it
                    -- counts, and its covered wakes are covered again.
                    unacknowledged_deliveries =
                        e.unacknowledged_deliveries + (p.how = 'expired')::int,
                    last_unacknowledged_at = CASE WHEN p.how = 'expired'
                        THEN e.lease_expires_at ELSE e.last_unacknowledged_at END,
                    -- The claim covers every wake pending now; later wakes
                    -- collect in due_at, apart from these.
                    covered_due_at = CASE WHEN p.how = 'expired'
                        THEN least(e.covered_due_at, e.due_at) ELSE e.due_at END,
                    due_at = NULL,
                    redeliver_after = NULL,
                    updated_at = now()
                FROM picked p
                WHERE e.execution_id = p.execution_id
                RETURNING e.execution_id, e.token, e.lease_expires_at, e.workflow_id, e.params,
                          e.context, e.outcome, e.unacknowledged_deliveries, e.deadline,
                          e.code_version, e.ever_suspended, p.how, p.old_owner, p.old_expiry
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'lease_expired', token - 1,
                       jsonb_build_object('owner', old_owner, 'expiredAt', old_expiry)
                FROM claimed WHERE how = 'expired'
                UNION ALL
                SELECT execution_id, 'claimed', token, jsonb_build_object('owner', $3::text)
                FROM claimed
            )
            SELECT * FROM claimed
            """,
            limit,
            float(duration),
            owner,
            self.redelivery_base,
            self.redelivery_cap,
        )
        return [
            Delivery(
                lease=Lease(r["execution_id"], r["token"], r["lease_expires_at"], owner),
                workflow_id=r["workflow_id"],
                params=r["params"],
                context=r["context"],
                status_before="suspended" if r["ever_suspended"] else "admitted",
                outcome=r["outcome"],
                unacknowledged_deliveries=r["unacknowledged_deliveries"],
                deadline=r["deadline"],
                code_version=r["code_version"],
            )
            for r in rows
        ]

    async def renew(self, leases: list[Lease], duration: float) -> tuple[list[Lease], list[Lease]]:
        """Extend every lease that is still current, in one statement.
        Returns (renewed, lost); a lost lease must stop its delivery."""
        if not leases:
            return [], []
        rows = await self.pool.fetch(
            """
            WITH held AS (
                SELECT * FROM unnest($1::text[], $2::bigint[]) AS h(execution_id, token)
            ), renewed AS (
                UPDATE executions e
                SET lease_expires_at = now() + make_interval(secs => $3)
                FROM held h
                -- Current token and a lease not ended by acknowledge, release
                -- or the reaper; UPDATE's row lock makes check and write one.
                WHERE e.execution_id = h.execution_id AND e.token = h.token
                  AND e.status = 'running'
                RETURNING e.execution_id, e.token, e.lease_expires_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token)
                SELECT h.execution_id, 'renewal_lost', h.token FROM held h
                WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.execution_id = h.execution_id)
            )
            SELECT * FROM renewed
            """,
            [lease.execution_id for lease in leases],
            [lease.token for lease in leases],
            float(duration),
        )
        expiry = {(r["execution_id"], r["token"]): r["lease_expires_at"] for r in rows}
        renewed, lost = [], []
        for lease in leases:
            key = (lease.execution_id, lease.token)
            if key in expiry:
                renewed.append(Lease(lease.execution_id, lease.token, expiry[key], lease.owner))
            else:
                lost.append(lease)
        return renewed, lost

    async def release(self, lease: Lease) -> None:
        """End the lease without an outcome: an unacknowledged delivery. The
        covered wakes stay pending and the redelivery delay starts now."""
        row = await self.pool.fetchrow(
            """
            WITH r AS (
                UPDATE executions
                SET status = CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END,
                    unacknowledged_deliveries = unacknowledged_deliveries + 1,
                    last_unacknowledged_at = now(),
                    redeliver_after = now()
                        + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $3, $4),
                    due_at = least(due_at, covered_due_at),
                    covered_due_at = NULL,
                    lease_owner = NULL,
                    lease_expires_at = NULL,
                    updated_at = now()
                WHERE execution_id = $1 AND token = $2 AND status = 'running'
                RETURNING execution_id, token, unacknowledged_deliveries, redeliver_after
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'released', token,
                       jsonb_build_object('unacknowledgedDeliveries', unacknowledged_deliveries,
                                          'redeliverAfter', redeliver_after)
                FROM r
            )
            SELECT * FROM r
            """,
            lease.execution_id,
            lease.token,
            self.redelivery_base,
            self.redelivery_cap,
        )
        if row is None:
            raise LeaseLost(lease.execution_id, lease.token)

    async def acknowledge(
        self,
        lease: Lease,
        status: Literal["suspended", "completed", "failed"],
        *,
        result: Any = None,
        error: dict | None = None,
    ) -> Acknowledged:
        """End the delivery with an outcome. Stale token → LeaseLost, nothing
        changes. Current token on a terminal record → the recorded outcome.
        Terminal outcomes are immutable; acknowledging clears the covered
        wakes, keeps later ones (suspended) and resets the counter."""
        if status == "completed":
            outcome: dict | None = {"result": result}
        elif status == "failed":
            outcome = {"error": error or {"name": "Error", "message": ""}}
        elif status == "suspended":
            outcome = None
        else:
            raise ValueError(f"cannot acknowledge status {status!r}")
        row = await self.pool.fetchrow(
            f"""
            WITH a AS (
                -- The UPDATE locks the row, so the token check and the write
                -- are one step: no claim can land between them.
                UPDATE executions
                SET status = $3,
                    outcome = $4,
                    ever_suspended = ever_suspended OR $3 = 'suspended',
                    due_at = CASE WHEN $3 = 'suspended' THEN due_at END,
                    covered_due_at = NULL,
                    lease_owner = NULL,
                    lease_expires_at = NULL,
                    unacknowledged_deliveries = 0,
                    last_unacknowledged_at = NULL,
                    redeliver_after = NULL,
                    updated_at = now()
                WHERE execution_id = $1 AND token = $2 AND status = 'running'
                RETURNING execution_id, token, status, outcome, due_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'acknowledged', token, jsonb_build_object('status', status)
                FROM a
            )
            SELECT status, outcome,
                   CASE WHEN due_at <= now() THEN pg_notify('{NOTIFY_CHANNEL}', '') END
            FROM a
            """,
            lease.execution_id,
            lease.token,
            status,
            outcome,
        )
        if row is not None:
            return Acknowledged(row["status"], row["outcome"])
        current = await self.pool.fetchrow(
            "SELECT token, status, outcome FROM executions WHERE execution_id = $1",
            lease.execution_id,
        )
        if (
            current is not None
            and current["token"] == lease.token
            and current["status"] in TERMINAL_STATUSES
        ):
            return Acknowledged(current["status"], current["outcome"])
        raise LeaseLost(lease.execution_id, lease.token)

    # ---------------------------------------------------------------------- steps

    async def write_step(
        self,
        lease: Lease,
        step_key: str,
        *,
        value: Any = None,
        error: dict | None = None,
        function_name: str | None = None,
        attempts: int = 1,
    ) -> StepRecord:
        """Record a step result under the lease, or return the one already
        recorded (idempotent for the current holder). Stale → LeaseLost.

        FOR SHARE on the execution row conflicts with the claim's row lock:
        either this statement locks first, and a claim skips the row until this
        step has committed (so the next holder sees it), or the claim commits
        first and the token check here re-reads the row and fails. Check and
        insert can never be split by a claim.
        """
        status = "failed" if error is not None else "completed"
        try:
            row = await self.pool.fetchrow(
                """
                WITH fence AS (
                    SELECT execution_id FROM executions
                    WHERE execution_id = $1 AND token = $2 AND status = 'running'
                    FOR SHARE
                ), ins AS (
                    INSERT INTO execution_steps
                        (execution_id, step_key, status, value, error, function_name,
                         attempts, token)
                    SELECT execution_id, $3, $4, $5, $6, $7, $8, $2 FROM fence
                    ON CONFLICT (execution_id, step_key) DO NOTHING
                    RETURNING step_key, status, value, error, function_name, attempts, token,
                              recorded_at
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, token, detail)
                    SELECT $1, 'step_recorded', $2,
                           jsonb_build_object('stepKey', $3::text, 'status', $4::text)
                    FROM ins
                )
                SELECT (SELECT count(*) FROM fence) AS fenced, ins.*
                FROM (SELECT 1) AS one LEFT JOIN ins ON true
                """,
                lease.execution_id,
                lease.token,
                step_key,
                status,
                value,
                error,
                function_name,
                attempts,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        if not row["fenced"]:
            await self.pool.execute(
                """
                INSERT INTO execution_events (execution_id, kind, token, detail)
                VALUES ($1, 'fenced_write_rejected', $2, jsonb_build_object('stepKey', $3::text))
                """,
                lease.execution_id,
                lease.token,
                step_key,
            )
            raise LeaseLost(lease.execution_id, lease.token)
        if row["step_key"] is not None:
            return _step(row)
        # Already recorded (by this holder or an earlier one): the recorded
        # value stands and is returned unchanged.
        existing = await self.pool.fetchrow(
            """
            SELECT step_key, status, value, error, function_name, attempts, token, recorded_at
            FROM execution_steps WHERE execution_id = $1 AND step_key = $2
            """,
            lease.execution_id,
            step_key,
        )
        return _step(existing)

    async def record_late_observation(
        self,
        lease: Lease,
        step_key: str | None,
        *,
        value: Any = None,
        error: dict | None = None,
    ) -> None:
        """Evidence from a stale holder: appended, never applied to state."""
        try:
            await self.pool.execute(
                """
                INSERT INTO late_observations (execution_id, step_key, token, owner, value, error)
                VALUES ($1, $2, $3, $4, $5, $6)
                """,
                lease.execution_id,
                step_key,
                lease.token,
                lease.owner,
                value,
                error,
            )
        except (ValueError, TypeError, asyncpg.DataError):
            await self.pool.execute(
                """
                INSERT INTO late_observations (execution_id, step_key, token, owner, value, error)
                VALUES ($1, $2, $3, $4, NULL, $5)
                """,
                lease.execution_id,
                step_key,
                lease.token,
                lease.owner,
                {"name": "UnstorableValue", "message": "the observed value is not valid JSON"},
            )

    # -------------------------------------------------------------------- reaper

    async def reap_expired(self, limit: int = 500) -> ReapResult:
        """End expired leases: status back to suspended/admitted, counter +1,
        covered wakes pending again, redelivery delay counted from the expiry."""
        rows = await self.pool.fetch(
            """
            WITH expired AS (
                SELECT execution_id, lease_owner AS old_owner FROM executions
                WHERE status = 'running' AND lease_expires_at <= now()
                ORDER BY lease_expires_at
                LIMIT $1
                FOR UPDATE SKIP LOCKED
            ), r AS (
                UPDATE executions e
                SET status = CASE WHEN e.ever_suspended THEN 'suspended' ELSE 'admitted' END,
                    unacknowledged_deliveries = e.unacknowledged_deliveries + 1,
                    last_unacknowledged_at = e.lease_expires_at,
                    redeliver_after = e.lease_expires_at
                        + fencepost_redelivery_delay(e.unacknowledged_deliveries + 1, $2, $3),
                    due_at = least(e.due_at, e.covered_due_at),
                    covered_due_at = NULL,
                    lease_owner = NULL,
                    lease_expires_at = NULL,
                    updated_at = now()
                FROM expired x
                WHERE e.execution_id = x.execution_id
                RETURNING e.execution_id, e.token, e.last_unacknowledged_at, x.old_owner
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'lease_expired', token,
                       jsonb_build_object('owner', old_owner, 'expiredAt', last_unacknowledged_at)
                FROM r
            )
            SELECT execution_id FROM r
            """,
            limit,
            self.redelivery_base,
            self.redelivery_cap,
        )
        ids = [r["execution_id"] for r in rows]
        return ReapResult(len(ids), ids)
