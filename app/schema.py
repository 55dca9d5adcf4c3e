"""The tables, as SQLAlchemy Core definitions: the single source of truth that
alembic migrations are checked against. Statements live in `app.store`.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

TERMINAL_STATUSES = ("completed", "failed", "cancelled", "timed_out")
STATUSES = ("admitted", "running", "suspended", "parked", *TERMINAL_STATUSES)

NOW = text("now()")


def bucket(primary_key: bool = False) -> Column:
    """The routing key of a row of one execution (migration 0010): always
    fencepost_bucket(execution_id) (the CHECK from bucket_of_execution), part
    of the primary key, the distribution column on Citus."""
    return Column("bucket", SmallInteger, nullable=False, primary_key=primary_key,
                  autoincrement=False)


def bucket_of_execution() -> CheckConstraint:
    return CheckConstraint("bucket = fencepost_bucket(execution_id)", name="bucket_of_execution")


def of_execution() -> ForeignKeyConstraint:
    """A row deleted with its execution's row."""
    return ForeignKeyConstraint(["execution_id", "bucket"],
                                ["executions.execution_id", "executions.bucket"],
                                ondelete="CASCADE")

executions = Table(
    "executions",
    metadata,
    Column("execution_id", Text, nullable=False),
    bucket(),
    Column("workflow_id", Text, nullable=False),
    # The event is stored once; every delivery reads it from here.
    Column("params", JSONB, nullable=False),
    Column("context", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("code_version", Text, nullable=True),
    # The API token that admitted it (a trigger token reads only its own).
    Column("admitted_by", Text, nullable=True),
    # Set for a child workflow: the parent and the parent's step that started
    # it (the receipt that makes start_child idempotent).
    Column("parent_execution_id", Text, nullable=True),
    Column("parent_step_key", Text, nullable=True),
    Column("status", Text, nullable=False, server_default=text("'admitted'")),
    Column("outcome", JSONB, nullable=True),
    Column("admitted_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Earliest pending wake not covered by the live claim (NULL: nothing pending).
    Column("due_at", DateTime(timezone=True), nullable=True),
    # Earliest wake covered by the live claim; cleared by acknowledge, merged
    # back into due_at when the lease ends without one.
    Column("covered_due_at", DateTime(timezone=True), nullable=True),
    # Fencing token: incremented by every claim, carried by every fenced write.
    Column("token", BigInteger, nullable=False, server_default=text("0")),
    # The last place in this execution's history handed out. The rule: every
    # statement that appends events to a history adds their number (or a
    # bound on it) here, on this row, and gives them the places it passed
    # (execution_events.seq), in the same statement: the row's lock orders
    # the writers of one history, on whichever node holds it.
    Column("event_seq", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_owner", Text, nullable=True),
    # Database time. Non-NULL exactly while status = 'running'.
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("unacknowledged_deliveries", Integer, nullable=False, server_default=text("0")),
    # When the last unacknowledged delivery ended, and when the execution is
    # claimable again after its redelivery delay.
    Column("last_unacknowledged_at", DateTime(timezone=True), nullable=True),
    Column("redeliver_after", DateTime(timezone=True), nullable=True),
    Column("ever_suspended", Boolean, nullable=False, server_default=text("false")),
    Column("parked_reason", Text, nullable=True),
    Column("parked_step", Text, nullable=True),
    # What the park found: for `nondeterminism`, the first divergence.
    Column("parked_detail", JSONB, nullable=True),
    Column("cancel_requested_at", DateTime(timezone=True), nullable=True),
    Column("cancel_requested_by", Text, nullable=True),
    # What the latest suspended acknowledgement waits for: {"sleep": key} or
    # {"signal": name}; read by blockedBy.
    Column("waiting_on", JSONB, nullable=True),
    Column("deadline", DateTime(timezone=True), nullable=True),
    # Seconds cleanup code may run after a cancel request or the deadline
    # (fencepost_cleanup_ends); each claim writes the claiming code's value.
    Column("cleanup_seconds", Float, nullable=False, server_default=text("30")),
    # Times redriven (POST .../redrive); a fork's source execution and step.
    Column("redrives", Integer, nullable=False, server_default=text("0")),
    Column("forked_from", Text, nullable=True),
    Column("forked_from_step", Text, nullable=True),
    # The admission's W3C traceparent: every delivery's span is its child.
    Column("traceparent", Text, nullable=True),
    # Late observations that disagreed with what was recorded (never applied).
    Column("integrity_conflicts", Integer, nullable=False, server_default=text("0")),
    # Flow control: the queue whose limits apply (fixed at admission), the
    # key its per-key limits count by, and the order among due executions
    # of the queue (lower first).
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("concurrency_key", Text, nullable=True),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("execution_id", "bucket"),
    bucket_of_execution(),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="status_known"
    ),
    # A live lease and the running status come and go together.
    CheckConstraint(
        "(status = 'running') = (lease_expires_at IS NOT NULL)", name="lease_iff_running"
    ),
    # Terminal records carry their outcome.
    CheckConstraint(
        "(status IN ('completed', 'failed', 'cancelled', 'timed_out')) = (outcome IS NOT NULL)",
        name="outcome_iff_terminal",
    ),
)

# claim_due reads only these two partial indexes, so terminal and parked rows,
# however many, are never scanned.
Index(
    "ix_executions_due",
    executions.c.due_at,
    postgresql_where=text("status IN ('admitted', 'suspended')"),
)
# A claim reads each queue's due executions in priority order from here.
Index(
    "ix_executions_queue_due",
    executions.c.queue,
    executions.c.priority,
    executions.c.due_at,
    postgresql_where=text("status IN ('admitted', 'suspended')"),
)
# What holds a queue's slots (counted under the queue's lock at each claim).
Index(
    "ix_executions_queue_held",
    executions.c.queue,
    executions.c.status,
    executions.c.concurrency_key,
    postgresql_include=["lease_expires_at"],
    postgresql_where=text("status IN ('running', 'suspended')"),
)
Index(
    "ix_executions_lease_expiry",
    executions.c.lease_expires_at,
    postgresql_where=text("status = 'running'"),
)
# The deadline sweep reads only unheld, unfinished executions with a deadline.
Index(
    "ix_executions_deadline",
    executions.c.deadline,
    postgresql_where=text("deadline IS NOT NULL AND status IN ('admitted', 'suspended', 'parked')"),
)
# The sweep's other half: unheld executions with a cancel pending (their
# cleanup delivery not yet taken when the window closes).
Index(
    "ix_executions_cancel_pending",
    executions.c.cancel_requested_at,
    postgresql_where=text(
        "cancel_requested_at IS NOT NULL AND status IN ('admitted', 'suspended', 'parked')"
    ),
)
# A source execution's forks.
Index(
    "ix_executions_forked_from",
    executions.c.forked_from,
    postgresql_where=text("forked_from IS NOT NULL"),
)
# Children of a parent: woken on their end, cancelled with it.
Index(
    "ix_executions_parent",
    executions.c.parent_execution_id,
    postgresql_where=text("parent_execution_id IS NOT NULL"),
)
# One child per (parent, step key): start_child's receipt. A stale or
# concurrent start of the same step can never leave a second child.
Index(
    "ux_executions_parent_step",
    executions.c.parent_execution_id,
    executions.c.parent_step_key,
    unique=True,
    postgresql_where=text("parent_execution_id IS NOT NULL"),
)
# Retention reads only terminal rows, oldest first.
Index(
    "ix_executions_terminal_updated",
    executions.c.updated_at,
    postgresql_where=text("status IN ('completed', 'failed', 'cancelled', 'timed_out')"),
)
# Operator listing: newest first per status, and the counter filter.
Index("ix_executions_status_admitted", executions.c.status, executions.c.admitted_at)
Index("ix_executions_workflow_admitted", executions.c.workflow_id, executions.c.admitted_at)
# A trigger token's own executions, newest first; and admittedAt ranges.
Index(
    "ix_executions_admitted_by_admitted",
    executions.c.admitted_by,
    executions.c.admitted_at,
    postgresql_where=text("admitted_by IS NOT NULL"),
)
Index("ix_executions_admitted", executions.c.admitted_at)
Index(
    "ix_executions_unacknowledged",
    executions.c.unacknowledged_deliveries,
    postgresql_where=text("unacknowledged_deliveries > 0"),
)

steps = Table(
    "execution_steps",
    metadata,
    Column("execution_id", Text, nullable=False),
    bucket(),
    Column("step_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("value", JSONB, nullable=True),
    Column("error", JSONB, nullable=True),
    Column("function_name", Text, nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    # The token of the holder whose write was accepted.
    Column("token", BigInteger, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Where in the code's order of asks it was asked for (replays compare);
    # NULL: recorded before positions were, or asked from a concurrent branch.
    Column("position", Integer, nullable=True),
    PrimaryKeyConstraint("execution_id", "step_key", "bucket"),
    of_execution(),
    bucket_of_execution(),
    CheckConstraint("status IN ('completed', 'failed')", name="status_known"),
)

events = Table(
    "execution_events",
    metadata,
    Column("event_id", BigInteger, primary_key=True, autoincrement=True),
    Column("execution_id", Text, nullable=False),
    bucket(primary_key=True),
    bucket_of_execution(),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("kind", Text, nullable=False),
    Column("token", BigInteger, nullable=True),
    Column("detail", JSONB, nullable=True),
    # Its place in the execution's history (increasing, not contiguous): the
    # history's order. Not event_id, which comes from a sequence (on Citus,
    # each node's own range).
    Column("seq", BigInteger, nullable=False),
)
Index("ux_execution_events_seq", events.c.execution_id, events.c.seq, events.c.bucket,
      unique=True)

late_observations = Table(
    "late_observations",
    metadata,
    Column("observation_id", BigInteger, primary_key=True, autoincrement=True),
    Column("execution_id", Text, nullable=False),
    bucket(primary_key=True),
    bucket_of_execution(),
    Column("step_key", Text, nullable=True),
    Column("token", BigInteger, nullable=False),
    Column("owner", Text, nullable=True),
    Column("value", JSONB, nullable=True),
    Column("error", JSONB, nullable=True),
    Column("observed_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Compared with the recorded step (or, for an acknowledgement, the terminal
    # outcome) when it was appended: NULL nothing recorded to compare with,
    # false the same, true different (an integrity conflict).
    Column("conflict", Boolean, nullable=True),
)
Index("ix_late_observations_execution", late_observations.c.execution_id)

# A tombstone per execution deleted by retention: the ID stays taken (admission
# refuses it) and its last fencing token is kept, so neither is ever reused.
retired_executions = Table(
    "retired_executions",
    metadata,
    Column("execution_id", Text, primary_key=True),
    bucket(primary_key=True),
    bucket_of_execution(),
    Column("last_token", BigInteger, nullable=False),
    Column("workflow_id", Text, nullable=True),
    Column("retired_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

signals = Table(
    "signals",
    metadata,
    Column("signal_id", BigInteger, primary_key=True, autoincrement=True),
    Column("execution_id", Text, nullable=False),
    bucket(primary_key=True),
    of_execution(),
    bucket_of_execution(),
    Column("name", Text, nullable=False),
    Column("payload", JSONB, nullable=True),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Who sent it: the API token (ID, name, role), or the operator through the
    # dashboard; NULL for signals stored before senders were recorded.
    Column("sender_token_id", Text, nullable=True),
    Column("sender_name", Text, nullable=True),
    Column("sender_role", Text, nullable=True),
    # Set once, by the fenced step that consumed the signal; never cleared.
    Column("consumed_step", Text, nullable=True),
    Column("consumed_token", BigInteger, nullable=True),
    Column("consumed_at", DateTime(timezone=True), nullable=True),
)
Index(
    "ix_signals_pending",
    signals.c.execution_id,
    signals.c.name,
    signals.c.signal_id,
    postgresql_where=text("consumed_step IS NULL"),
)

workers = Table(
    "workers",
    metadata,
    Column("worker_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("workflows", JSONB, nullable=False),
    # {workflow: code version or null}: a claim takes a versioned execution
    # only from a worker carrying its version.
    Column("versions", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("stopped_at", DateTime(timezone=True), nullable=True),
)

# An external call's attempt, persisted before the call is made, so a later
# delivery that finds it without a recorded step knows the outcome is in doubt.
effects = Table(
    "effects",
    metadata,
    Column("execution_id", Text, nullable=False),
    bucket(),
    Column("step_key", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("function_name", Text, nullable=True),
    # started: attempt made, result not yet recorded; outcome_unknown: parked
    # for an operator; retry: an operator allowed one more call.
    Column("status", Text, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    PrimaryKeyConstraint("execution_id", "step_key", "bucket"),
    of_execution(),
    bucket_of_execution(),
    CheckConstraint("status IN ('started', 'outcome_unknown', 'retry')", name="status_known"),
)

# Bearer API tokens. Only a hash of the secret is stored; the token is shown once.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("secret_sha256", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # Quotas: most admissions / signals per minute for this token; NULL: none.
    Column("admissions_per_minute", Integer, nullable=True),
    Column("signals_per_minute", Integer, nullable=True),
    CheckConstraint("role IN ('trigger', 'read', 'operate')", name="role_known"),
    CheckConstraint(
        "coalesce(admissions_per_minute, 1) > 0 AND coalesce(signals_per_minute, 1) > 0",
        name="quotas_positive",
    ),
)

# Dashboard sessions: the cookie holds a random session ID, stored here only
# as its SHA-256. A session ends at its expiry, at logout, or when its token
# is revoked (the token's row is read with the session).
ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("session_sha256", Text, primary_key=True),
    Column(
        "token_id",
        Text,
        ForeignKey("api_tokens.token_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
)
Index("ix_ui_sessions_token", ui_sessions.c.token_id)

# Schedules: a cron expression in a time zone; each slot is admitted as the
# execution `{schedule_id}:{slot in UTC}`, so the unique execution ID makes a
# slot fire once however many workers evaluate it.
schedules = Table(
    "schedules",
    metadata,
    Column("schedule_id", Text, primary_key=True),
    Column("workflow_id", Text, nullable=False),
    Column("cron", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("params", JSONB, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # Most missed slots admitted at once; NULL: the worker's FENCEPOST_SCHEDULE_CATCH_UP.
    Column("catch_up", Integer, nullable=True),
    Column("source", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Slots up to this instant have been evaluated (admitted or skipped);
    # creation time at first, so nothing before the schedule existed fires.
    Column("last_slot", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("source IN ('code', 'api')", name="source_known"),
    CheckConstraint("catch_up IS NULL OR catch_up >= 1", name="catch_up_positive"),
)
Index("ix_schedules_workflow_id", schedules.c.workflow_id)

# A schedule's own history (created, fired, skipped, paused, resumed,
# deleted), apart from the executions' events: no execution ID can reach it.
schedule_events = Table(
    "schedule_events",
    metadata,
    Column("event_id", BigInteger, primary_key=True, autoincrement=True),
    Column("schedule_id", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("kind", Text, nullable=False),
    Column("detail", JSONB, nullable=True),
)
Index("ix_schedule_events_schedule_id", schedule_events.c.schedule_id, schedule_events.c.event_id)

# Failed attempts of a step (and `Retry` reasons of deliveries: step_key NULL),
# newest kept: the statement that appends one trims the step's history to the
# last ATTEMPT_HISTORY rows, so a step retried forever holds a bounded trail.
attempt_history = Table(
    "attempt_history",
    metadata,
    Column("attempt_id", BigInteger, primary_key=True, autoincrement=True),
    Column("execution_id", Text, nullable=False),
    bucket(primary_key=True),
    of_execution(),
    bucket_of_execution(),
    Column("step_key", Text, nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("error", JSONB, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
)
Index("ix_attempt_history_execution_id", attempt_history.c.execution_id, attempt_history.c.step_key,
      attempt_history.c.attempt_id)

# Settings every process must agree on (poison threshold, lease, redelivery):
# written once, read (or checked) by every process at start.
shared_settings = Table(
    "shared_settings",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# Steps a redrive took out of the record (the failed step and what was
# recorded after it), kept as they were, with when and by which redrive.
superseded_steps = Table(
    "superseded_steps",
    metadata,
    Column("superseded_id", BigInteger, primary_key=True, autoincrement=True),
    Column("execution_id", Text, nullable=False),
    bucket(primary_key=True),
    of_execution(),
    bucket_of_execution(),
    Column("step_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("value", JSONB, nullable=True),
    Column("error", JSONB, nullable=True),
    Column("function_name", Text, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("superseded_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("redrive", Integer, nullable=False),
)
Index("ix_superseded_steps_execution", superseded_steps.c.execution_id,
      superseded_steps.c.superseded_id)

# A bulk action over the executions its filter matched when it was created
# (its items), carried out by workers in bounded batches; each item is marked
# in the transaction that acts on its execution, so a crash repeats nothing.
operations = Table(
    "operations",
    metadata,
    Column("operation_id", Text, primary_key=True),
    Column("action", Text, nullable=False),
    Column("filter", JSONB, nullable=False),
    # Action arguments (redrive: fromStep, timeoutSeconds; resolve: the resolution).
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("reason", Text, nullable=True),
    Column("created_by", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("matched", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("action IN ('cancel', 'redrive', 'resume', 'resolve')", name="action_known"),
    CheckConstraint("status IN ('running', 'completed', 'cancelled')", name="status_known"),
)
operation_items = Table(
    "operation_items",
    metadata,
    Column(
        "operation_id",
        Text,
        ForeignKey("operations.operation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("execution_id", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("code", Text, nullable=True),
    Column("message", Text, nullable=True),
    Column("done_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("operation_id", "execution_id"),
    CheckConstraint("status IN ('pending', 'done', 'failed')", name="status_known"),
)
Index(
    "ix_operation_items_pending",
    operation_items.c.operation_id,
    operation_items.c.execution_id,
    postgresql_where=text("status = 'pending'"),
)

# Executions a long-poll (GET ...?waitSeconds=) has waited for: only their ends
# are announced on fencepost_ended. A NOTIFY serializes commits database-wide,
# so the ends nobody waits for announce nothing.
watched_executions = Table(
    "watched_executions",
    metadata,
    Column("execution_id", Text, primary_key=True),
    bucket(primary_key=True),
    Column("since", DateTime(timezone=True), nullable=False, server_default=NOW),
    of_execution(),
    bucket_of_execution(),
)

# One row per maintenance role, held by one worker until expires_at (database
# clock). The holder renews it; anyone takes it over once expired; token grows
# by one at every change of term, so a paused holder finds its term over.
maintenance_leases = Table(
    "maintenance_leases",
    metadata,
    Column("role", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("renewed_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("token > 0", name="token_positive"),
)

# Flow control. A queue's effective settings (the view queue_settings) are
# what its code declares, overlaid field by field with what an operator set.
queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("declared", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("override", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# The first claims of rate-limited queues' executions, kept for one period.
queue_starts = Table(
    "queue_starts",
    metadata,
    Column("queue", Text, nullable=False),
    Column("concurrency_key", Text, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)
Index("ix_queue_starts_queue", queue_starts.c.queue, queue_starts.c.concurrency_key,
      queue_starts.c.started_at)

# Each run-time change of a queue's settings: who, when, what.
queue_changes = Table(
    "queue_changes",
    metadata,
    Column("change_id", BigInteger, primary_key=True, autoincrement=True),
    Column("queue", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("actor", Text, nullable=True),
    Column("change", JSONB, nullable=False),
)
Index("ix_queue_changes_queue", queue_changes.c.queue, queue_changes.c.change_id)
