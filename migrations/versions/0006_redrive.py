"""redrive: superseded steps, redrive count, fork links, bulk operations

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 17:40:00

- `superseded_steps`: steps a redrive took out of the record (the failed
  step and what was recorded after it), kept with when and by which redrive;
  never deleted except with their execution.
- `executions.redrives`: how many times the execution was redriven.
- `executions.forked_from` / `forked_from_step`: the execution and step a
  fork copied its history from (the source names the fork in a `forked`
  event); indexed for the listing of a source's forks.
- `watched_executions`: executions a long-poll has waited for; only their
  ends are announced on `fencepost_ended` (a NOTIFY serializes commits, so
  ends nobody waits for send none).
- `executions.traceparent`: the W3C trace context of the admission, the parent
  of every delivery's span (app/tracing.py).
- `operations` / `operation_items`: a bulk action (cancel, redrive, resume,
  resolve) over the executions a filter matched when it was created (the
  items), carried out by workers in bounded batches; each item is marked in
  the transaction that acts on its execution, so a crash repeats nothing.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'superseded_steps',
        sa.Column('superseded_id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('execution_id', sa.Text(), nullable=False),
        sa.Column('step_key', sa.Text(), nullable=False),
        sa.Column('status', sa.Text(), nullable=False),
        sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('function_name', sa.Text(), nullable=True),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('superseded_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('redrive', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'],
                                name=op.f('fk_superseded_steps_execution_id'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('superseded_id', name=op.f('pk_superseded_steps')),
    )
    op.create_index('ix_superseded_steps_execution', 'superseded_steps',
                    ['execution_id', 'superseded_id'])
    op.add_column('executions', sa.Column('redrives', sa.Integer(), nullable=False,
                                          server_default=sa.text('0')))
    op.add_column('executions', sa.Column('forked_from', sa.Text(), nullable=True))
    op.add_column('executions', sa.Column('forked_from_step', sa.Text(), nullable=True))
    op.add_column('executions', sa.Column('traceparent', sa.Text(), nullable=True))
    op.create_index('ix_executions_forked_from', 'executions', ['forked_from'],
                    postgresql_where=sa.text('forked_from IS NOT NULL'))
    op.create_table(
        'operations',
        sa.Column('operation_id', sa.Text(), nullable=False),
        sa.Column('action', sa.Text(), nullable=False),
        sa.Column('filter', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('options', postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                  server_default=sa.text("'{}'::jsonb")),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('created_by', sa.Text(), nullable=False),
        sa.Column('status', sa.Text(), nullable=False),
        sa.Column('matched', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("action IN ('cancel', 'redrive', 'resume', 'resolve')",
                           name=op.f('ck_operations_action_known')),
        sa.CheckConstraint("status IN ('running', 'completed', 'cancelled')",
                           name=op.f('ck_operations_status_known')),
        sa.PrimaryKeyConstraint('operation_id', name=op.f('pk_operations')),
    )
    op.create_table(
        'operation_items',
        sa.Column('operation_id', sa.Text(), nullable=False),
        sa.Column('execution_id', sa.Text(), nullable=False),
        sa.Column('status', sa.Text(), nullable=False, server_default=sa.text("'pending'")),
        sa.Column('code', sa.Text(), nullable=True),
        sa.Column('message', sa.Text(), nullable=True),
        sa.Column('done_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'done', 'failed')",
                           name=op.f('ck_operation_items_status_known')),
        sa.ForeignKeyConstraint(['operation_id'], ['operations.operation_id'],
                                name=op.f('fk_operation_items_operation_id'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('operation_id', 'execution_id', name=op.f('pk_operation_items')),
    )
    op.create_table(
        'watched_executions',
        sa.Column('execution_id', sa.Text(), nullable=False),
        sa.Column('since', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'],
                                name=op.f('fk_watched_executions_execution_id'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('execution_id', name=op.f('pk_watched_executions')),
    )
    op.create_index('ix_operation_items_pending', 'operation_items',
                    ['operation_id', 'execution_id'],
                    postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    op.drop_index('ix_operation_items_pending', table_name='operation_items')
    op.drop_table('watched_executions')
    op.drop_table('operation_items')
    op.drop_table('operations')
    op.drop_index('ix_executions_forked_from', table_name='executions')
    op.drop_column('executions', 'traceparent')
    op.drop_column('executions', 'forked_from_step')
    op.drop_column('executions', 'forked_from')
    op.drop_column('executions', 'redrives')
    op.drop_index('ix_superseded_steps_execution', table_name='superseded_steps')
    op.drop_table('superseded_steps')
