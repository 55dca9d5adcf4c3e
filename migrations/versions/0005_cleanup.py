"""cleanup: a window for workflow cleanup after a cancel or the deadline

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 17:20:00

- `executions.cleanup_seconds`: how long the workflow's cleanup code
  (`except Cancelled:`, `finally:`) may run after a cancel request or the
  deadline; written by each claim from the claiming worker's code
  (`@workflow(cancel_grace=)`, else its setting). Existing rows get the
  default, 30 s.
- `fencepost_cleanup_ends(cancel_requested_at, deadline, cleanup_seconds)`:
  the instant after which no code of the execution may run (NULL: no cancel
  and no deadline). The one statement of that rule, used by claims, renewals,
  the sweep and reads.
- `ix_executions_cancel_pending`: unheld executions with a cancel pending,
  for the sweep that ends those whose window closed unclaimed.
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

CLEANUP_ENDS_FUNCTION = """
CREATE FUNCTION fencepost_cleanup_ends(cancel_requested_at timestamptz, deadline timestamptz,
                                       cleanup_seconds double precision)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- least() skips NULLs: the earlier of the two that happened.
    SELECT least(cancel_requested_at, deadline) + make_interval(secs => cleanup_seconds)
$$
"""


def upgrade() -> None:
    op.add_column('executions', sa.Column('cleanup_seconds', sa.Float(), nullable=False,
                                          server_default=sa.text('30')))
    op.execute(CLEANUP_ENDS_FUNCTION)
    op.create_index('ix_executions_cancel_pending', 'executions', ['cancel_requested_at'],
                    postgresql_where=sa.text(
                        "cancel_requested_at IS NOT NULL"
                        " AND status IN ('admitted', 'suspended', 'parked')"))


def downgrade() -> None:
    op.drop_index('ix_executions_cancel_pending', table_name='executions')
    op.execute("DROP FUNCTION fencepost_cleanup_ends(timestamptz, timestamptz, double precision)")
    op.drop_column('executions', 'cleanup_seconds')
