"""execution record, steps, events, late observations

Revision ID: 0001
Revises:
Create Date: 2026-11-29 09:24:42.357511
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

REDELIVERY_DELAY_FUNCTION = """
CREATE FUNCTION fencepost_redelivery_delay(n integer, base_seconds double precision,
                                           cap_seconds double precision)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT make_interval(secs => least(base_seconds * power(2, least(greatest(n, 1) - 1, 62)),
                                       cap_seconds))
$$
"""


def upgrade() -> None:
    # Redelivery delay after the n-th consecutive unacknowledged delivery:
    # base * 2^(n-1), capped; never decreasing while n grows.
    op.execute(REDELIVERY_DELAY_FUNCTION)
    op.create_table('execution_events',
    sa.Column('event_id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.PrimaryKeyConstraint('event_id', name=op.f('pk_execution_events'))
    )
    op.create_index('ix_execution_events_execution', 'execution_events', ['execution_id', 'event_id'], unique=False)
    op.create_table('executions',
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('workflow_id', sa.Text(), nullable=False),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('context', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('code_version', sa.Text(), nullable=True),
    sa.Column('admitted_by', sa.Text(), nullable=True),
    sa.Column('parent_execution_id', sa.Text(), nullable=True),
    sa.Column('parent_step_key', sa.Text(), nullable=True),
    sa.Column('status', sa.Text(), server_default=sa.text("'admitted'"), nullable=False),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('admitted_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('covered_due_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('token', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_owner', sa.Text(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('unacknowledged_deliveries', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_unacknowledged_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('redeliver_after', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ever_suspended', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('parked_reason', sa.Text(), nullable=True),
    sa.Column('parked_step', sa.Text(), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_by', sa.Text(), nullable=True),
    sa.Column('waiting_on', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("(status = 'running') = (lease_expires_at IS NOT NULL)", name=op.f('ck_executions_lease_iff_running')),
    sa.CheckConstraint("(status IN ('completed', 'failed', 'cancelled', 'timed_out')) = (outcome IS NOT NULL)", name=op.f('ck_executions_outcome_iff_terminal')),
    sa.CheckConstraint("status IN ('admitted', 'running', 'suspended', 'parked', 'completed', 'failed', 'cancelled', 'timed_out')", name=op.f('ck_executions_status_known')),
    sa.PrimaryKeyConstraint('execution_id', name=op.f('pk_executions'))
    )
    op.create_index('ix_executions_deadline', 'executions', ['deadline'], unique=False, postgresql_where=sa.text("deadline IS NOT NULL AND status IN ('admitted', 'suspended', 'parked')"))
    op.create_index('ix_executions_terminal_updated', 'executions', ['updated_at'], unique=False, postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled', 'timed_out')"))
    op.create_index('ix_executions_parent', 'executions', ['parent_execution_id'], unique=False, postgresql_where=sa.text('parent_execution_id IS NOT NULL'))
    op.create_index('ix_executions_due', 'executions', ['due_at'], unique=False, postgresql_where=sa.text("status IN ('admitted', 'suspended')"))
    op.create_index('ix_executions_lease_expiry', 'executions', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'running'"))
    op.create_index('ix_executions_status_admitted', 'executions', ['status', 'admitted_at'], unique=False)
    op.create_index('ix_executions_unacknowledged', 'executions', ['unacknowledged_deliveries'], unique=False, postgresql_where=sa.text('unacknowledged_deliveries > 0'))
    op.create_index('ix_executions_workflow_admitted', 'executions', ['workflow_id', 'admitted_at'], unique=False)
    op.create_table('late_observations',
    sa.Column('observation_id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('step_key', sa.Text(), nullable=True),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('owner', sa.Text(), nullable=True),
    sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('observed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('observation_id', name=op.f('pk_late_observations'))
    )
    op.create_index('ix_late_observations_execution', 'late_observations', ['execution_id'], unique=False)
    op.create_table('execution_steps',
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('step_key', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('function_name', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('completed', 'failed')", name=op.f('ck_execution_steps_status_known')),
    sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'], name=op.f('fk_execution_steps_execution_id'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('execution_id', 'step_key', name=op.f('pk_execution_steps'))
    )

    op.create_table('signals',
    sa.Column('signal_id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('consumed_step', sa.Text(), nullable=True),
    sa.Column('consumed_token', sa.BigInteger(), nullable=True),
    sa.Column('consumed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'], name=op.f('fk_signals_execution_id'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('signal_id', name=op.f('pk_signals'))
    )
    op.create_index('ix_signals_pending', 'signals', ['execution_id', 'name', 'signal_id'], unique=False, postgresql_where=sa.text('consumed_step IS NULL'))
    op.create_table('workers',
    sa.Column('worker_id', sa.Text(), nullable=False),
    sa.Column('host', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('workflows', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('worker_id', name=op.f('pk_workers'))
    )
    op.create_table('effects',
    sa.Column('execution_id', sa.Text(), nullable=False),
    sa.Column('step_key', sa.Text(), nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=False),
    sa.Column('function_name', sa.Text(), nullable=True),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('started', 'outcome_unknown', 'retry')", name=op.f('ck_effects_status_known')),
    sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'], name=op.f('fk_effects_execution_id'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('execution_id', 'step_key', name=op.f('pk_effects'))
    )
    op.create_table('api_tokens',
    sa.Column('token_id', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('role', sa.Text(), nullable=False),
    sa.Column('secret_sha256', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role IN ('trigger', 'read', 'operate')", name=op.f('ck_api_tokens_role_known')),
    sa.PrimaryKeyConstraint('token_id', name=op.f('pk_api_tokens'))
    )
    op.create_table('schedules',
    sa.Column('schedule_id', sa.Text(), nullable=False),
    sa.Column('workflow_id', sa.Text(), nullable=False),
    sa.Column('cron', sa.Text(), nullable=False),
    sa.Column('timezone', sa.Text(), nullable=False),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('paused', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('catch_up', sa.Integer(), nullable=True),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_slot', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("source IN ('code', 'api')", name=op.f('ck_schedules_source_known')),
    sa.CheckConstraint('catch_up IS NULL OR catch_up >= 1', name=op.f('ck_schedules_catch_up_positive')),
    sa.PrimaryKeyConstraint('schedule_id', name=op.f('pk_schedules'))
    )
    op.create_index('ix_schedules_workflow_id', 'schedules', ['workflow_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_schedules_workflow_id', table_name='schedules')
    op.drop_table('schedules')
    op.drop_table('api_tokens')
    op.drop_table('effects')
    op.drop_table('workers')
    op.drop_index('ix_signals_pending', table_name='signals', postgresql_where=sa.text('consumed_step IS NULL'))
    op.drop_table('signals')
    op.drop_table('execution_steps')
    op.drop_index('ix_late_observations_execution', table_name='late_observations')
    op.drop_table('late_observations')
    op.drop_index('ix_executions_workflow_admitted', table_name='executions')
    op.drop_index('ix_executions_unacknowledged', table_name='executions', postgresql_where=sa.text('unacknowledged_deliveries > 0'))
    op.drop_index('ix_executions_status_admitted', table_name='executions')
    op.drop_index('ix_executions_lease_expiry', table_name='executions', postgresql_where=sa.text("status = 'running'"))
    op.drop_index('ix_executions_deadline', table_name='executions', postgresql_where=sa.text("deadline IS NOT NULL AND status IN ('admitted', 'suspended', 'parked')"))
    op.drop_index('ix_executions_terminal_updated', table_name='executions', postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled', 'timed_out')"))
    op.drop_index('ix_executions_parent', table_name='executions', postgresql_where=sa.text('parent_execution_id IS NOT NULL'))
    op.drop_index('ix_executions_due', table_name='executions', postgresql_where=sa.text("status IN ('admitted', 'suspended')"))
    op.drop_table('executions')
    op.drop_index('ix_execution_events_execution', table_name='execution_events')
    op.drop_table('execution_events')
    op.execute("DROP FUNCTION fencepost_redelivery_delay(integer, double precision, double precision)")
