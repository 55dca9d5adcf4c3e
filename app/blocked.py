"""`blockedBy`: why an execution is not moving right now, computed from its
healed record (app/store/types.py's record_columns: the record as the reaper
will leave it). One answer per record, the first rule of RULES that holds:

| reason | meaning | what to do |
|---|---|---|
| (none) | terminal | nothing |
| `parked` | `outcome_unknown` (a step's effect is in doubt) or `poison` | resolve the step / fix the cause, then resume |
| `leased` | a worker holds a live lease (owner, until) | wait; a cancel request is seen at its next step |
| `lease-expired` | the holder stopped renewing; another worker takes over after the redelivery delay | check the holder |
| `redelivery-delay` | the last delivery ended unacknowledged; not claimable until T | look at the events and logs |
| `waiting-for-child` | waits for child execution ID to end | look at the child |
| `waiting-for-signal` | waits for signal NAME (until T, if it has a timeout) | send the signal |
| `delayed-start` | admitted with a later start (`startAt` / `delaySeconds`), first due at T | wait, or wake it now |
| `sleeping` | a durable timer, due at T | wait, or wake it now |
| `queue-paused` | due (or its lease expired), but its queue is paused (queue) | resume the queue |
| `concurrency-limit` | due (or its lease expired), but its queue's concurrency limit, or its key's per-key limit, is full (queue, key, running, limit) | wait for a slot, or raise the limit |
| `rate-limited` | a first start, but its queue's (or key's) starts within the rate period are spent (queue, key, until) | wait until T, or raise the rate limit |
| `no-worker` | due, but no live worker runs this workflow | start a worker with this workflow |
| `no-worker-for-version` | due (or its lease expired), admitted under code version V, but of the live workers that run its workflow none carries V (workflowId, version) | start a worker with that version of the workflow |
| `due` | due, waiting for a free worker | add workers or concurrency if it lasts |

Once a cancel is pending, every answer also says `cancelRequested: true`.

The rules are written once, as data; the API and the dashboard's page ask
`blocked_by` (Python), the dashboard's listing filters with `reason_sql`
(SQL), and both are read off the same table. Each condition below knows how
to test a row and how to say the same in SQL; each SQL form is never NULL,
so `CASE WHEN` and Python's `if` take the same branch.

A queue holds back a due execution exactly as the claim counts
(fencepost_claim_limits and Leases.claim_due): a slot is held by a running
execution with an unexpired lease, and by a suspended one when the queue
holds slots while suspended (a suspended execution of such a queue already
holds its slot, so no slot limit holds it back); a start is a first claim
(token 0), counted in queue_starts within the rate period, per queue or, with
rate_per_key, per key; an execution without a concurrency key is under no
per-key limit. What each queue and key holds now is read in SQL
(QUEUE_STATE_CTES) and handed to the Python form with the live workflows
(`Live.queues`), as `live` is.

A worker carries each of its workflows at one code version, or unversioned
(a worker registered before versions were recorded carries each
unversioned). An execution admitted under version V is claimed only by a
worker carrying V of its workflow (Leases.claim_due); an unversioned one by
any worker running its workflow. `live` says both in one text[]: each
workflow some live worker runs, and `carried(workflow, version)` for each
version one carries (LIVE_SQL reads it from the workers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.schema import TERMINAL_STATUSES

# A healed execution record, by column name.
Row = Mapping[str, Any]

# ------------------------------------------------------------------ conditions


# ------------------------------------------------------------ queue state


@dataclass(frozen=True)
class Held:
    """What one queue, or one key of it, holds now, as the claim counts:
    slots held, and starts within the rate period (the oldest of them)."""

    running: int = 0
    starts: int = 0
    oldest_start: datetime | None = None


@dataclass(frozen=True)
class QueueState:
    """A queue's effective settings (None: no such limit) and what it holds:
    `held.starts` counts the queue's starts when its rate limit is per queue;
    `keys` what each key holds (a key not listed holds nothing)."""

    name: str
    paused: bool = False
    concurrency: int | None = None
    per_key_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    rate_per_key: bool = False
    hold_while_suspended: bool = False
    held: Held = Held()
    keys: Mapping[str, Held] = field(default_factory=dict)


# Between a workflow ID and a version in `carried`: no workflow ID holds it
# (IDs are letters, digits and . _ : -), so a carried version never reads as
# a workflow and the first one splits the two.
_CARRIES = "\x1f"


def carried(workflow_id: str, version: str) -> str:
    """What `live` holds when a live worker carries `version` of the workflow."""
    return f"{workflow_id}{_CARRIES}{version}"


def workflows_of(live: Iterable[str]) -> set[str]:
    """The workflow IDs of `live` (without the versions carried)."""
    return {w for w in live if _CARRIES not in w}


class Live(set[str]):
    """The workflows some live worker runs, with `carried(workflow, version)`
    for each code version one carries of it, and what holds each queue back
    now (`queues`: by name; None when unknown, and then no queue rule holds)."""

    def __init__(self, workflows: Iterable[str] = (),
                 queues: Mapping[str, QueueState] | None = None,
                 versions: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(workflows)
        self.update(carried(w, v) for w, v in versions)
        self.queues = queues


# The live workers' `live`, as one text[] (a SELECT's one column): the
# workflows of each worker that has heartbeated within `$stale` seconds and
# not stopped, and carried(workflow, version) for each version in its
# `versions` ({workflow: version or null}; a missing or null entry:
# unversioned, which carries no version).
def live_sql(stale: str) -> str:
    live = (f"stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => {stale})")
    return f"""ARRAY(
        SELECT jsonb_array_elements_text(workflows) FROM workers WHERE {live}
        UNION
        SELECT v.key || chr({ord(_CARRIES)}) || v.value
        FROM workers, jsonb_each_text(versions) v
        WHERE {live} AND v.value IS NOT NULL)"""


@dataclass(frozen=True)
class Known:
    """What the rules read besides the record."""

    live: set[str] | None
    queues: Mapping[str, QueueState] | None

    def queue_of(self, row: Row) -> QueueState | None:
        return None if self.queues is None else self.queues.get(row.get("queue") or "")

    def key_of(self, row: Row) -> Held | None:
        """What the row's key holds; None for a row without a key."""
        q, key = self.queue_of(row), row.get("concurrency_key")
        if q is None or key is None:
            return None
        return q.keys.get(key, Held())


def _known(live: set[str] | None) -> Known:
    return Known(live, getattr(live, "queues", None))


@dataclass(frozen=True)
class Sql:
    """The SQL names the conditions read: the healed record `r`, the live
    workflows and the versions carried of them `live` (a text[] expression,
    as Live holds them; NULL: unknown), and the queue's
    and key's state rows `q` and `k` (QUEUE_STATE_CTES joined by
    queue_state_joins); `q` None: unknown, and then no queue rule holds."""

    r: str
    live: str
    q: str | None = None
    k: str | None = None


class Condition:
    def holds(self, row: Row, known: Known) -> bool:
        raise NotImplementedError

    def sql(self, n: Sql) -> str:
        """Over the healed record aliased `n.r`; never NULL."""
        raise NotImplementedError


def _literal(value: str) -> str:
    assert "'" not in value
    return f"'{value}'"


@dataclass(frozen=True)
class StatusIn(Condition):
    statuses: tuple[str, ...]

    def holds(self, row: Row, known: Known) -> bool:
        return row["status"] in self.statuses

    def sql(self, n: Sql) -> str:
        return f"({n.r}.status IN ({', '.join(map(_literal, self.statuses))}))"


@dataclass(frozen=True)
class Flag(Condition):
    column: str

    def holds(self, row: Row, known: Known) -> bool:
        return bool(row[self.column])

    def sql(self, n: Sql) -> str:
        return f"coalesce({n.r}.{self.column}, false)"


@dataclass(frozen=True)
class Later(Condition):
    """The time in `column` is set and still ahead of the read."""

    column: str

    def holds(self, row: Row, known: Known) -> bool:
        return row[self.column] is not None and row[self.column] > row["read_at"]

    def sql(self, n: Sql) -> str:
        return f"coalesce({n.r}.{self.column} > {n.r}.read_at, false)"


@dataclass(frozen=True)
class NeverClaimed(Condition):
    """No delivery has ever been made (token 0)."""

    def holds(self, row: Row, known: Known) -> bool:
        return bool(row["token"] == 0)

    def sql(self, n: Sql) -> str:
        return f"({n.r}.token = 0)"


@dataclass(frozen=True)
class NotDue(Condition):
    """No wake pending, or the earliest lies ahead."""

    def holds(self, row: Row, known: Known) -> bool:
        return row["due_at"] is None or row["due_at"] > row["read_at"]

    def sql(self, n: Sql) -> str:
        return f"coalesce({n.r}.due_at > {n.r}.read_at, true)"


@dataclass(frozen=True)
class WaitsOn(Condition):
    """The last suspension waits on `key` (waiting_on: {"child": ...} etc)."""

    key: str

    def holds(self, row: Row, known: Known) -> bool:
        return self.key in (row.get("waiting_on") or {})

    def sql(self, n: Sql) -> str:
        return f"coalesce({n.r}.waiting_on ? {_literal(self.key)}, false)"


@dataclass(frozen=True)
class NoLiveWorker(Condition):
    """Known live workers, none of which runs the workflow."""

    def holds(self, row: Row, known: Known) -> bool:
        return known.live is not None and row["workflow_id"] not in known.live

    def sql(self, n: Sql) -> str:
        return f"coalesce(NOT ({n.r}.workflow_id = ANY({n.live})), false)"


@dataclass(frozen=True)
class NoLiveWorkerForVersion(Condition):
    """Admitted under a code version, its workflow run by a known live
    worker, none of which carries that version of it."""

    def holds(self, row: Row, known: Known) -> bool:
        version = row.get("code_version")
        return (known.live is not None and version is not None
                and row["workflow_id"] in known.live
                and carried(row["workflow_id"], version) not in known.live)

    def sql(self, n: Sql) -> str:
        token = f"{n.r}.workflow_id || chr({ord(_CARRIES)}) || {n.r}.code_version"
        return (f"coalesce({n.r}.code_version IS NOT NULL AND {n.r}.workflow_id = ANY({n.live}) "
                f"AND NOT ({token} = ANY({n.live})), false)")


@dataclass(frozen=True)
class QueuePaused(Condition):
    """Its queue is paused: the claim takes nothing from it."""

    def holds(self, row: Row, known: Known) -> bool:
        q = known.queue_of(row)
        return q is not None and q.paused

    def sql(self, n: Sql) -> str:
        return "false" if n.q is None else f"coalesce({n.q}.paused, false)"


def _takes_slot(row: Row, q: QueueState) -> bool:
    """A suspended execution of a queue that holds slots while suspended
    already holds one; every other claim takes one."""
    return not (q.hold_while_suspended and row["status"] == "suspended")


def _takes_slot_sql(n: Sql) -> str:
    return f"NOT ({n.q}.hold_while_suspended AND {n.r}.status = 'suspended')"


@dataclass(frozen=True)
class QueueFull(Condition):
    """Every slot of the queue's concurrency limit is held."""

    def holds(self, row: Row, known: Known) -> bool:
        q = known.queue_of(row)
        return (q is not None and q.concurrency is not None and _takes_slot(row, q)
                and q.held.running >= q.concurrency)

    def sql(self, n: Sql) -> str:
        if n.q is None:
            return "false"
        return f"coalesce({_takes_slot_sql(n)} AND {n.q}.running >= {n.q}.concurrency, false)"


@dataclass(frozen=True)
class KeyFull(Condition):
    """Every slot of its key's per-key limit is held (no key: no such limit)."""

    def holds(self, row: Row, known: Known) -> bool:
        q, k = known.queue_of(row), known.key_of(row)
        return (q is not None and k is not None and q.per_key_concurrency is not None
                and _takes_slot(row, q) and k.running >= q.per_key_concurrency)

    def sql(self, n: Sql) -> str:
        if n.q is None:
            return "false"
        return (f"coalesce({n.r}.concurrency_key IS NOT NULL AND {_takes_slot_sql(n)} "
                f"AND coalesce({n.k}.running, 0) >= {n.q}.per_key_concurrency, false)")


@dataclass(frozen=True)
class QueueStartsSpent(Condition):
    """A first start, and the queue's starts within the period are spent
    (a rate limit per queue)."""

    def holds(self, row: Row, known: Known) -> bool:
        q = known.queue_of(row)
        return (q is not None and row["token"] == 0 and q.rate_limit is not None
                and not q.rate_per_key and q.held.starts >= q.rate_limit)

    def sql(self, n: Sql) -> str:
        if n.q is None:
            return "false"
        return (f"coalesce({n.r}.token = 0 AND NOT {n.q}.rate_per_key "
                f"AND {n.q}.starts >= {n.q}.rate_limit, false)")


@dataclass(frozen=True)
class KeyStartsSpent(Condition):
    """A first start, and its key's starts within the period are spent (a
    rate limit per key; no key: no such limit)."""

    def holds(self, row: Row, known: Known) -> bool:
        q, k = known.queue_of(row), known.key_of(row)
        return (q is not None and k is not None and row["token"] == 0
                and q.rate_limit is not None and q.rate_per_key and k.starts >= q.rate_limit)

    def sql(self, n: Sql) -> str:
        if n.q is None:
            return "false"
        return (f"coalesce({n.r}.token = 0 AND {n.r}.concurrency_key IS NOT NULL "
                f"AND {n.q}.rate_per_key "
                f"AND coalesce({n.k}.starts, 0) >= {n.q}.rate_limit, false)")


@dataclass(frozen=True)
class All(Condition):
    parts: tuple[Condition, ...]

    def holds(self, row: Row, known: Known) -> bool:
        return all(p.holds(row, known) for p in self.parts)

    def sql(self, n: Sql) -> str:
        return "(" + " AND ".join(p.sql(n) for p in self.parts) + ")"


@dataclass(frozen=True)
class AnyOf(Condition):
    parts: tuple[Condition, ...]

    def holds(self, row: Row, known: Known) -> bool:
        return any(p.holds(row, known) for p in self.parts)

    def sql(self, n: Sql) -> str:
        return "(" + " OR ".join(p.sql(n) for p in self.parts) + ")"


@dataclass(frozen=True)
class Always(Condition):
    def holds(self, row: Row, known: Known) -> bool:
        return True

    def sql(self, n: Sql) -> str:
        return "true"


# ------------------------------------------------------------------- the rules

NONE = "none"  # terminal: blockedBy is null

# In order: the first that holds is the answer.
RULES: tuple[tuple[str, Condition], ...] = (
    (NONE, StatusIn(tuple(TERMINAL_STATUSES))),
    ("parked", StatusIn(("parked",))),
    ("leased", StatusIn(("running",))),
    # An expired lease is taken over only where its queue has room.
    ("queue-paused", All((Flag("lease_expired"), QueuePaused()))),
    ("concurrency-limit", All((Flag("lease_expired"), AnyOf((QueueFull(), KeyFull()))))),
    # ... and only by a worker carrying its code version.
    ("no-worker-for-version", All((Flag("lease_expired"), NoLiveWorkerForVersion()))),
    ("lease-expired", Flag("lease_expired")),
    ("redelivery-delay", Later("redeliver_after")),
    ("waiting-for-child", All((NotDue(), WaitsOn("child")))),
    ("waiting-for-signal", All((NotDue(), WaitsOn("signal")))),
    ("delayed-start", All((NotDue(), StatusIn(("admitted",)), NeverClaimed()))),
    ("sleeping", NotDue()),
    # Due from here on; held back by its queue first, in the claim's order.
    ("queue-paused", QueuePaused()),
    ("concurrency-limit", AnyOf((QueueFull(), KeyFull()))),
    ("rate-limited", AnyOf((QueueStartsSpent(), KeyStartsSpent()))),
    ("no-worker", NoLiveWorker()),
    ("no-worker-for-version", NoLiveWorkerForVersion()),
    ("due", Always()),
)
REASONS: tuple[str, ...] = tuple(dict.fromkeys(reason for reason, _ in RULES))
# Due, but its queue holds it back (the claim would not take it now).
QUEUE_REASONS: tuple[str, ...] = ("queue-paused", "concurrency-limit", "rate-limited")


def reason_of(row: Row, live_workflows: set[str] | None) -> str:
    """`live_workflows`: a Live carries the queues' state too (a plain set:
    unknown, and no queue rule holds)."""
    known = _known(live_workflows)
    for reason, condition in RULES:
        if condition.holds(row, known):
            return reason
    raise AssertionError("the last rule always holds")


def reason_sql(r: str = "r", live: str = "NULL::text[]", q: str | None = None,
               k: str | None = None) -> str:
    """RULES as one SQL expression over the healed record aliased `r`; `q`
    and `k` name the queue's and the key's state rows (queue_state_joins),
    None when the statement has none (no queue rule holds then)."""
    n = Sql(r, live, q, k)
    whens = "\n".join(f"         WHEN {c.sql(n)} THEN {_literal(reason)}"
                      for reason, c in RULES)
    return f"CASE\n{whens}\n    END"


# ------------------------------------------------ the queues' state, in SQL

# What each queue and key holds now, counted as fencepost_claim_limits
# counts (see the module's docstring), read by one subquery per queue and
# per key over ix_executions_queue_held and ix_queue_starts_queue. Put after
# WITH; queue_state_joins joins them to the healed record.
QUEUE_STATE_CTES = """
-- Citus: what each queue and key holds, counted over every bucket (multi-shard).
-- Executions are counted by joins, not by subqueries correlated with a
-- queue's row: Citus refuses those over a distributed table when the FROM
-- clause holds a reference table (queues).
held AS MATERIALIZED (
    SELECT e.queue, count(*)::integer AS running
    FROM executions e JOIN queue_settings s ON s.name = e.queue
    WHERE e.status IN ('running', 'suspended')
      AND ((e.status = 'running' AND e.lease_expires_at > now())
           OR (s.hold_while_suspended AND e.status = 'suspended'))
    GROUP BY e.queue
), queue_state AS MATERIALIZED (
    SELECT s.name, s.paused, s.concurrency, s.per_key_concurrency, s.rate_limit, s.rate_period,
           s.rate_per_key, s.hold_while_suspended, coalesce(h.running, 0) AS running,
           st.starts, st.oldest_start
    FROM queue_settings s
    LEFT JOIN held h ON h.queue = s.name
    LEFT JOIN LATERAL (
        -- Starts of a queue rate-limited per queue (per key: key_state), one
        -- index probe per queue (queue_starts and queues: reference tables,
        -- which Citus lets a subquery correlate).
        SELECT count(*)::integer AS starts, min(x.started_at) AS oldest_start
        FROM queue_starts x
        WHERE x.queue = s.name AND x.started_at > now() - make_interval(secs => s.rate_period)
    ) st ON s.rate_limit IS NOT NULL AND NOT s.rate_per_key
), key_state AS MATERIALIZED (
    SELECT h.queue, h.concurrency_key, sum(h.held)::integer AS running,
           sum(h.started)::integer AS starts, min(h.started_at) AS oldest_start
    FROM (
        SELECT e.queue, e.concurrency_key, count(*) AS held, 0 AS started,
               NULL::timestamptz AS started_at
        FROM executions e JOIN queue_settings s ON s.name = e.queue
        WHERE s.per_key_concurrency IS NOT NULL
          AND e.status IN ('running', 'suspended')
          AND e.concurrency_key IS NOT NULL
          AND ((e.status = 'running' AND e.lease_expires_at > now())
               OR (s.hold_while_suspended AND e.status = 'suspended'))
        GROUP BY e.queue, e.concurrency_key
        UNION ALL
        -- Starts per key, one index probe per queue rate-limited per key.
        SELECT s.name, x.concurrency_key, 0, x.started, x.started_at
        FROM queue_settings s, LATERAL (
            SELECT x.concurrency_key, count(*) AS started, min(x.started_at) AS started_at
            FROM queue_starts x
            WHERE s.rate_limit IS NOT NULL AND s.rate_per_key
              AND x.queue = s.name AND x.concurrency_key IS NOT NULL
              AND x.started_at > now() - make_interval(secs => s.rate_period)
            GROUP BY x.concurrency_key
        ) x
    ) h
    GROUP BY h.queue, h.concurrency_key
)"""


def queue_state_joins(r: str = "r", q: str = "q", k: str = "k") -> str:
    """The record `r`'s queue and key state rows, as `q` and `k` (NULL when
    none: a key not listed holds nothing)."""
    return (f"LEFT JOIN queue_state {q} ON {q}.name = {r}.queue "
            f"LEFT JOIN key_state {k} ON {k}.queue = {r}.queue "
            f"AND {k}.concurrency_key = {r}.concurrency_key")


def queue_states(queue_rows: Iterable[Row], key_rows: Iterable[Row]) -> dict[str, QueueState]:
    """The Python form of the queue_state and key_state rows."""
    keys: dict[str, dict[str, Held]] = {}
    for k in key_rows:
        keys.setdefault(k["queue"], {})[k["concurrency_key"]] = Held(
            int(k["running"]), int(k["starts"]), k["oldest_start"])
    return {
        q["name"]: QueueState(
            name=q["name"], paused=bool(q["paused"]), concurrency=q["concurrency"],
            per_key_concurrency=q["per_key_concurrency"], rate_limit=q["rate_limit"],
            rate_period=q["rate_period"], rate_per_key=bool(q["rate_per_key"]),
            hold_while_suspended=bool(q["hold_while_suspended"]),
            held=Held(int(q["running"]), int(q["starts"] or 0), q["oldest_start"]),
            keys=keys.get(q["name"], {}))
        for q in queue_rows
    }


# ----------------------------------------------------------------- the answer


def blocked_by(row: Row, live_workflows: set[str] | None) -> dict[str, Any] | None:
    """`row` is a healed record (store.history.get/list, store.dashboard.ui_list, with read_at =
    the database's now). `live_workflows`: workflows some live worker runs;
    None when unknown; a Live also knows what holds each queue back."""
    known = _known(live_workflows)
    reason = reason_of(row, live_workflows)
    if reason == NONE:
        return None
    answer: dict[str, Any] = {"reason": reason, **_DETAILS[reason](row, known)}
    if row["cancel_requested_at"] is not None:
        # Not yet ended: its cleanup is running or waits for a delivery.
        answer["cancelRequested"] = True
    return answer


def _concurrency_limit(row: Row, known: Known) -> dict[str, Any]:
    q = known.queue_of(row)
    assert q is not None  # the rule held
    if QueueFull().holds(row, known):
        return {"queue": q.name, "running": q.held.running, "limit": q.concurrency}
    k = known.key_of(row)
    assert k is not None
    return {"queue": q.name, "key": row["concurrency_key"], "running": k.running,
            "limit": q.per_key_concurrency}


def _rate_limited(row: Row, known: Known) -> dict[str, Any]:
    """`until`: when the oldest start counted in the period leaves it."""
    q = known.queue_of(row)
    assert q is not None and q.rate_period is not None  # the rule held
    held, key = q.held, {}
    if q.rate_per_key:
        held, key = known.key_of(row) or Held(), {"key": row["concurrency_key"]}
    until = (held.oldest_start + timedelta(seconds=q.rate_period)
             if held.oldest_start is not None else None)
    return {"queue": q.name, **key, "until": until}


_DETAILS: dict[str, Callable[[Row, Known], dict[str, Any]]] = {
    "parked": lambda row, _: {"parkedReason": row["parked_reason"], "step": row["parked_step"]},
    "leased": lambda row, _: {"owner": row["lease_owner"], "until": row["lease_expires_at"]},
    "lease-expired": lambda row, _: {"since": row["last_unacknowledged_at"],
                                     "until": row["redeliver_after"]},
    "redelivery-delay": lambda row, _: {"until": row["redeliver_after"]},
    "waiting-for-child": lambda row, _: {"child": row["waiting_on"]["child"]},
    "waiting-for-signal": lambda row, _: {"signal": row["waiting_on"]["signal"],
                                          "until": row["due_at"]},
    "delayed-start": lambda row, _: {"until": row["due_at"]},
    "sleeping": lambda row, _: {"step": (row.get("waiting_on") or {}).get("sleep"),
                                "until": row["due_at"]},
    "queue-paused": lambda row, known: {"queue": row["queue"]},
    "concurrency-limit": _concurrency_limit,
    "rate-limited": _rate_limited,
    "no-worker": lambda row, _: {"workflowId": row["workflow_id"], "since": row["due_at"]},
    "no-worker-for-version": lambda row, _: {
        "workflowId": row["workflow_id"], "version": row["code_version"],
        # Waiting since its expired lease's last delivery ended, else since due.
        "since": row["last_unacknowledged_at"] if row["lease_expired"] else row["due_at"]},
    "due": lambda row, _: {"since": row["due_at"]},
}
assert set(_DETAILS) | {NONE} == set(REASONS)
