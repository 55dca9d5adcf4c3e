"""versions: routing by code version, recorded step order, patches

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:00:00

- `execution_steps.position`: where in the code's order of asks (steps,
  sleeps, signal waits, children, patch markers) the step was asked for, so
  a replay that asks for something else at that position is caught
  (nondeterminism). NULL for steps recorded before this revision and for
  steps asked from a concurrent branch (their order is not the code's).
- `executions.parked_detail`: what a park found (for `nondeterminism`, the
  first divergence); NULL for the other reasons.
- `workers.versions`: the code version each workflow of the worker carries
  ({workflow: version or null}); `{}` for workers registered before.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('execution_steps', sa.Column('position', sa.Integer(), nullable=True))
    op.add_column('executions', sa.Column('parked_detail', postgresql.JSONB(), nullable=True))
    op.add_column('workers', sa.Column('versions', postgresql.JSONB(), nullable=False,
                                       server_default=sa.text("'{}'::jsonb")))


def downgrade() -> None:
    op.drop_column('workers', 'versions')
    op.drop_column('executions', 'parked_detail')
    op.drop_column('execution_steps', 'position')
