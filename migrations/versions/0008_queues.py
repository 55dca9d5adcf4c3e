"""queues: flow control (concurrency, per-key concurrency, rate limits, pause),
priorities and delayed starts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:55:00

- `executions.queue` (every execution is on one; existing ones on `default`),
  `executions.concurrency_key` and `executions.priority` (lower first).
- `queues`: one row per queue, the settings its code declares (`declared`)
  and those an operator set at run time (`override`, which wins field by
  field); `queue_settings` is the effective setting of each.
- `queue_starts`: the starts (first claims) of rate-limited queues within
  their period; `queue_changes`: who changed a queue's settings, and how.
- `fencepost_claim_limits(workflow_ids)`: called by every claim before it picks rows
  (see the function's comments for why counting happens there).
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

QUEUE_SETTINGS = """
CREATE VIEW queue_settings AS
SELECT q.name,
       (s->>'concurrency')::integer AS concurrency,
       (s->>'per_key_concurrency')::integer AS per_key_concurrency,
       (s->>'rate_limit')::integer AS rate_limit,
       (s->>'rate_period')::double precision AS rate_period,
       coalesce((s->>'rate_per_key')::boolean, false) AS rate_per_key,
       coalesce((s->>'hold_while_suspended')::boolean, false) AS hold_while_suspended,
       coalesce((s->>'paused')::boolean, false) AS paused,
       -- Claims of a limited queue count under its exclusive lock.
       (s->>'concurrency') IS NOT NULL OR (s->>'per_key_concurrency') IS NOT NULL
           OR (s->>'rate_limit') IS NOT NULL AS limited
FROM queues q, LATERAL (SELECT q.declared || q.override AS s) x
"""

# Why a function: a claim must count what its queue runs *after* it holds the
# queue's lock. A statement's own snapshot is taken before any lock it waits
# for, so a count in the claim statement itself could miss rows another
# claimer claimed and committed while this one waited: two claimers would
# each see one free slot and both take it. A VOLATILE function's statements
# each take a fresh snapshot, so the counts below, made after the locks are
# granted, see every claim committed by the locks' earlier holders.
CLAIM_LIMITS = """
CREATE FUNCTION fencepost_claim_limits(workflow_ids text[])
RETURNS TABLE (queue text, concurrency_key text, is_key boolean, closed boolean,
               run_free integer, start_free integer, hold boolean,
               key_run_limit integer, key_start_limit integer)
-- A handful of rows (one per queue, one per busy key): saying so keeps the
-- claim's cached generic plan cheap, so the claim is not planned anew each time.
LANGUAGE plpgsql VOLATILE ROWS 4 AS $$
DECLARE
    q record;
    exclusive text[] := '{}';
BEGIN
    -- The queues' settings, shared: a change of them (PUT /v1/queues, a
    -- deploy's declaration) takes this lock exclusively, so it waits for the
    -- claims in flight, and every statement below reads the settings as the
    -- last change before this claim left them.
    PERFORM pg_advisory_xact_lock_shared(1179665746, 0);
    -- A limited queue is locked exclusively, so its claims count and take
    -- slots one at a time; in name order, so two claimers never wait for
    -- each other in a cycle. Only those in which this claimer (running
    -- `workflow_ids`; NULL: any) has due or expired work: the others are
    -- closed for this claim, and claimers of other work never wait for them.
    FOR q IN SELECT s.name FROM queue_settings s WHERE s.limited ORDER BY s.name LOOP
        IF EXISTS (SELECT 1 FROM executions e
                   WHERE e.queue = q.name AND e.status IN ('admitted', 'suspended')
                     AND e.due_at <= now()
                     AND (workflow_ids IS NULL OR e.workflow_id = ANY(workflow_ids)))
           OR EXISTS (SELECT 1 FROM executions e
                      WHERE e.status = 'running' AND e.lease_expires_at <= now()
                        AND e.queue = q.name
                        AND (workflow_ids IS NULL OR e.workflow_id = ANY(workflow_ids)))
        THEN
            PERFORM pg_advisory_xact_lock(1179665745, hashtext(q.name));
            exclusive := exclusive || q.name;
        END IF;
    END LOOP;
    -- Starts older than the period no longer limit anything.
    IF cardinality(exclusive) > 0 THEN
        DELETE FROM queue_starts st USING queue_settings s
        WHERE st.queue = s.name AND s.name = ANY(exclusive)
          AND (s.rate_limit IS NULL
               OR st.started_at <= now() - make_interval(secs => s.rate_period));
    END IF;
    -- From here on each statement sees every claim committed before the
    -- locks were granted. A limited queue not locked here is closed for
    -- this claim; an unlimited one (a queue that appeared since included:
    -- it is unlimited until a change, which waits for this claim) is open.
    RETURN QUERY
    SELECT s.name, NULL::text, false,
           s.paused OR (s.limited AND NOT s.name = ANY(exclusive)),
           CASE WHEN s.concurrency IS NULL THEN NULL
                ELSE greatest(s.concurrency - (
                    SELECT count(*) FROM executions e
                    WHERE e.queue = s.name
                      AND ((e.status = 'running' AND e.lease_expires_at > now())
                           OR (s.hold_while_suspended AND e.status = 'suspended'))), 0)
           END::integer,
           CASE WHEN s.rate_limit IS NULL OR s.rate_per_key THEN NULL
                ELSE greatest(s.rate_limit - (
                    SELECT count(*) FROM queue_starts st
                    WHERE st.queue = s.name
                      AND st.started_at > now() - make_interval(secs => s.rate_period)), 0)
           END::integer,
           s.hold_while_suspended,
           s.per_key_concurrency,
           CASE WHEN s.rate_per_key THEN s.rate_limit END
    FROM queue_settings s;
    IF cardinality(exclusive) = 0 THEN
        RETURN;  -- no limited queue: no key is limited either
    END IF;
    -- Keys that hold slots or started within the period, in queues limited
    -- per key; a key not listed has its whole per-key limit free.
    RETURN QUERY
    SELECT k.queue, k.concurrency_key, true, false,
           CASE WHEN s.per_key_concurrency IS NULL THEN NULL
                ELSE greatest(s.per_key_concurrency - sum(k.held), 0) END::integer,
           CASE WHEN s.rate_per_key THEN greatest(s.rate_limit - sum(k.started), 0) END::integer,
           s.hold_while_suspended, s.per_key_concurrency,
           CASE WHEN s.rate_per_key THEN s.rate_limit END
    FROM (
        SELECT e.queue, e.concurrency_key, 1 AS held, 0 AS started
        FROM executions e JOIN queue_settings s ON s.name = e.queue
        WHERE s.name = ANY(exclusive) AND s.per_key_concurrency IS NOT NULL
          AND e.concurrency_key IS NOT NULL
          AND e.status IN ('running', 'suspended')
          AND ((e.status = 'running' AND e.lease_expires_at > now())
               OR (s.hold_while_suspended AND e.status = 'suspended'))
        UNION ALL
        SELECT st.queue, st.concurrency_key, 0, 1
        FROM queue_starts st JOIN queue_settings s ON s.name = st.queue
        WHERE s.name = ANY(exclusive) AND s.rate_per_key AND st.concurrency_key IS NOT NULL
          AND st.started_at > now() - make_interval(secs => s.rate_period)
    ) k JOIN queue_settings s ON s.name = k.queue
    GROUP BY k.queue, k.concurrency_key, s.per_key_concurrency, s.rate_per_key, s.rate_limit,
             s.hold_while_suspended;
END
$$
"""


def upgrade() -> None:
    op.add_column('executions', sa.Column('queue', sa.Text(), server_default=sa.text("'default'"),
                                          nullable=False))
    op.add_column('executions', sa.Column('concurrency_key', sa.Text(), nullable=True))
    op.add_column('executions', sa.Column('priority', sa.Integer(), server_default=sa.text('0'),
                                          nullable=False))
    op.create_index('ix_executions_queue_due', 'executions', ['queue', 'priority', 'due_at'],
                    postgresql_where=sa.text("status IN ('admitted', 'suspended')"))
    op.create_index('ix_executions_queue_held', 'executions',
                    ['queue', 'status', 'concurrency_key'],
                    postgresql_include=['lease_expires_at'],
                    postgresql_where=sa.text("status IN ('running', 'suspended')"))
    op.create_table(
        'queues',
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('declared', sa.dialects.postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column('override', sa.dialects.postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_queues')),
    )
    op.execute("INSERT INTO queues (name) VALUES ('default')")
    op.create_table(
        'queue_starts',
        sa.Column('queue', sa.Text(), nullable=False),
        sa.Column('concurrency_key', sa.Text(), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
    )
    op.create_index('ix_queue_starts_queue', 'queue_starts',
                    ['queue', 'concurrency_key', 'started_at'])
    op.create_table(
        'queue_changes',
        sa.Column('change_id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('queue', sa.Text(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('actor', sa.Text(), nullable=True),
        sa.Column('change', sa.dialects.postgresql.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint('change_id', name=op.f('pk_queue_changes')),
    )
    op.create_index('ix_queue_changes_queue', 'queue_changes', ['queue', 'change_id'])
    op.execute(QUEUE_SETTINGS)
    op.execute(CLAIM_LIMITS)


def downgrade() -> None:
    op.execute("DROP FUNCTION fencepost_claim_limits(text[])")
    op.execute("DROP VIEW queue_settings")
    op.drop_index('ix_queue_changes_queue', table_name='queue_changes')
    op.drop_table('queue_changes')
    op.drop_index('ix_queue_starts_queue', table_name='queue_starts')
    op.drop_table('queue_starts')
    op.drop_table('queues')
    op.drop_index('ix_executions_queue_held', table_name='executions')
    op.drop_index('ix_executions_queue_due', table_name='executions')
    op.drop_column('executions', 'priority')
    op.drop_column('executions', 'concurrency_key')
    op.drop_column('executions', 'queue')
