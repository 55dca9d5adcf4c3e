"""event positions: a per-execution counter orders each execution's history

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 11:00:00

Every event gets `seq`, its place in its execution's history, handed out by a
counter on the execution's row (`executions.event_seq`, the last place taken)
in the statement that writes the event. The history is read in that order,
not in `event_id` order: event IDs come from a sequence, and on Citus from
each node's own range, so an event written on another node (or after the
execution's shard moved to a node of a lower range) would sort out of place.

Existing events are numbered 1, 2, ... per execution in their `event_id`
order (the order they were read in until now), and each execution's counter
is set to its last place. `ix_execution_events_execution` (execution_id,
event_id) gives way to a unique index on (execution_id, seq, bucket): no two
events of one execution share a place.
"""

from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE executions ADD COLUMN event_seq bigint NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE execution_events ADD COLUMN seq bigint")
    op.execute("""
        UPDATE execution_events ev SET seq = n.seq
        FROM (SELECT event_id, bucket,
                     row_number() OVER (PARTITION BY bucket, execution_id
                                        ORDER BY event_id) AS seq
              FROM execution_events) n
        WHERE ev.event_id = n.event_id AND ev.bucket = n.bucket
    """)
    op.execute("""
        UPDATE executions e SET event_seq = n.last
        FROM (SELECT execution_id, bucket, max(seq) AS last FROM execution_events
              GROUP BY bucket, execution_id) n
        WHERE e.execution_id = n.execution_id AND e.bucket = n.bucket
    """)
    op.execute("ALTER TABLE execution_events ALTER COLUMN seq SET NOT NULL")
    op.create_index('ux_execution_events_seq', 'execution_events',
                    ['execution_id', 'seq', 'bucket'], unique=True)
    op.drop_index('ix_execution_events_execution', table_name='execution_events')


def downgrade() -> None:
    op.create_index('ix_execution_events_execution', 'execution_events',
                    ['execution_id', 'event_id'], unique=False)
    op.drop_index('ux_execution_events_seq', table_name='execution_events')
    op.execute("ALTER TABLE execution_events DROP COLUMN seq")
    op.execute("ALTER TABLE executions DROP COLUMN event_seq")
