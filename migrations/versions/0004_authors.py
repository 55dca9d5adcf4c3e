"""authors: attempt history, shared settings

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 16:02:00

- `attempt_history`: each failed attempt of a step (error, time, token) and
  each `Retry(reason)` of a delivery (step_key NULL), bounded per step.
- `shared_settings`: settings every process must agree on, stored once.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'attempt_history',
        sa.Column('attempt_id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('execution_id', sa.Text(), nullable=False),
        sa.Column('step_key', sa.Text(), nullable=True),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['execution_id'], ['executions.execution_id'],
                                name=op.f('fk_attempt_history_execution_id'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('attempt_id', name=op.f('pk_attempt_history')),
    )
    op.create_index('ix_attempt_history_execution_id', 'attempt_history',
                    ['execution_id', 'step_key', 'attempt_id'])
    op.create_table(
        'shared_settings',
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_shared_settings')),
    )


def downgrade() -> None:
    op.drop_table('shared_settings')
    op.drop_index('ix_attempt_history_execution_id', table_name='attempt_history')
    op.drop_table('attempt_history')
