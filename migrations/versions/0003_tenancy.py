"""tenancy: signal senders, schedule history in its own table, dashboard
sessions, token quotas, list indexes

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 15:10:00

- `signals.sender_*`: who sent each signal (token ID, name, role).
- `schedule_events`: a schedule's history, moved out of `execution_events`
  (where it lived under the pseudo execution ID `schedule:{id}`, an ID a
  client could also admit). Rows whose `schedule:...` ID is a real execution
  stay where they are.
- `ui_sessions`: server-side dashboard sessions (only a SHA-256 of the ID).
- `api_tokens.admissions_per_minute`, `signals_per_minute`: per-token quotas.
- `ix_executions_admitted_by_admitted`, `ix_executions_admitted`: the list
  endpoint's owner and time-range filters.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

MOVE_SCHEDULE_EVENTS = """
WITH moved AS (
    DELETE FROM execution_events ev
    WHERE ev.execution_id LIKE 'schedule:%'
      AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.execution_id = ev.execution_id)
    RETURNING ev.event_id, ev.execution_id, ev.at, ev.kind, ev.detail
)
INSERT INTO schedule_events (schedule_id, at, kind, detail)
SELECT substr(execution_id, length('schedule:') + 1), at, kind, detail
FROM moved ORDER BY event_id
"""

MOVE_SCHEDULE_EVENTS_BACK = """
INSERT INTO execution_events (execution_id, at, kind, detail)
SELECT 'schedule:' || schedule_id, at, kind, detail FROM schedule_events ORDER BY event_id
"""


def upgrade() -> None:
    op.add_column('signals', sa.Column('sender_token_id', sa.Text(), nullable=True))
    op.add_column('signals', sa.Column('sender_name', sa.Text(), nullable=True))
    op.add_column('signals', sa.Column('sender_role', sa.Text(), nullable=True))

    op.create_table(
        'schedule_events',
        sa.Column('event_id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('schedule_id', sa.Text(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint('event_id', name=op.f('pk_schedule_events')),
    )
    op.create_index('ix_schedule_events_schedule_id', 'schedule_events',
                    ['schedule_id', 'event_id'])
    op.execute(MOVE_SCHEDULE_EVENTS)

    op.create_table(
        'ui_sessions',
        sa.Column('session_sha256', sa.Text(), nullable=False),
        sa.Column('token_id', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['token_id'], ['api_tokens.token_id'],
                                name=op.f('fk_ui_sessions_token_id'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('session_sha256', name=op.f('pk_ui_sessions')),
    )
    op.create_index('ix_ui_sessions_token', 'ui_sessions', ['token_id'])

    op.add_column('api_tokens', sa.Column('admissions_per_minute', sa.Integer(), nullable=True))
    op.add_column('api_tokens', sa.Column('signals_per_minute', sa.Integer(), nullable=True))
    op.create_check_constraint(
        'quotas_positive', 'api_tokens',
        'coalesce(admissions_per_minute, 1) > 0 AND coalesce(signals_per_minute, 1) > 0')

    op.create_index('ix_executions_admitted_by_admitted', 'executions',
                    ['admitted_by', 'admitted_at'],
                    postgresql_where=sa.text('admitted_by IS NOT NULL'))
    op.create_index('ix_executions_admitted', 'executions', ['admitted_at'])


def downgrade() -> None:
    op.drop_index('ix_executions_admitted', table_name='executions')
    op.drop_index('ix_executions_admitted_by_admitted', table_name='executions',
                  postgresql_where=sa.text('admitted_by IS NOT NULL'))
    op.drop_constraint('quotas_positive', 'api_tokens', type_='check')
    op.drop_column('api_tokens', 'signals_per_minute')
    op.drop_column('api_tokens', 'admissions_per_minute')
    op.drop_index('ix_ui_sessions_token', table_name='ui_sessions')
    op.drop_table('ui_sessions')
    op.execute(MOVE_SCHEDULE_EVENTS_BACK)
    op.drop_index('ix_schedule_events_schedule_id', table_name='schedule_events')
    op.drop_table('schedule_events')
    op.drop_column('signals', 'sender_role')
    op.drop_column('signals', 'sender_name')
    op.drop_column('signals', 'sender_token_id')
