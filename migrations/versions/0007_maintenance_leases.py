"""maintenance leases: one worker at a time runs each maintenance role

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 20:10:00

- `maintenance_leases`: one row per maintenance role (the sweeps: reaper,
  retention and bulk operations; the schedules of a set of workflows), held
  by one worker until `expires_at` on the database clock. The holder renews
  it; anyone takes it over once it has expired, and `token` grows by one at
  every change of term, so a holder that was paused past its expiry finds
  its term over before its next sweep.
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'maintenance_leases',
        sa.Column('role', sa.Text(), nullable=False),
        sa.Column('holder', sa.Text(), nullable=False),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('acquired_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('renewed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint('token > 0', name=op.f('ck_maintenance_leases_token_positive')),
        sa.PrimaryKeyConstraint('role', name=op.f('pk_maintenance_leases')),
    )


def downgrade() -> None:
    op.drop_table('maintenance_leases')
