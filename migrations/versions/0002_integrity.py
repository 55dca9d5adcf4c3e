"""integrity: one child per parent step, retired execution IDs, late
observations compared with the record

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 14:40:00

- `retired_executions`: a tombstone per execution deleted by retention (ID,
  last token), so an ID is never admitted twice and its token never restarts.
- `executions.integrity_conflicts`: late observations that disagreed with
  the record.
- `late_observations.conflict`: NULL nothing recorded to compare with, false
  the same as recorded, true different.
- `ux_executions_parent_step`: one child per (parent, step key).

Data: 0001 let a stale holder start a second child for a step the current
holder had also started. Before the unique index is built, each such
(parent, step key) keeps its link on one child: the one the parent's step
recorded, else the earliest admitted. The others keep their rows and their
parent (a cancel still reaches them) but lose the step key, with a
`child_link_detached` event naming the kept child. Nothing is deleted.
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

DETACH_DUPLICATE_CHILDREN = """
WITH ranked AS (
    SELECT c.execution_id, c.parent_execution_id, c.parent_step_key,
           row_number() OVER (
               PARTITION BY c.parent_execution_id, c.parent_step_key
               ORDER BY (s.value = to_jsonb(c.execution_id)) IS TRUE DESC,
                        c.admitted_at, c.execution_id) AS n,
           first_value(c.execution_id) OVER (
               PARTITION BY c.parent_execution_id, c.parent_step_key
               ORDER BY (s.value = to_jsonb(c.execution_id)) IS TRUE DESC,
                        c.admitted_at, c.execution_id) AS kept
    FROM executions c
    LEFT JOIN execution_steps s
      ON s.execution_id = c.parent_execution_id AND s.step_key = c.parent_step_key
    WHERE c.parent_execution_id IS NOT NULL AND c.parent_step_key IS NOT NULL
), detached AS (
    UPDATE executions e SET parent_step_key = NULL, updated_at = now()
    FROM ranked r
    WHERE e.execution_id = r.execution_id AND r.n > 1
    RETURNING e.execution_id, r.parent_execution_id, r.parent_step_key, r.kept
)
INSERT INTO execution_events (execution_id, kind, detail)
SELECT execution_id, 'child_link_detached',
       jsonb_build_object('parentExecutionId', parent_execution_id,
                          'parentStepKey', parent_step_key,
                          'keptExecutionId', kept)
FROM detached
"""


def upgrade() -> None:
    op.create_table(
        'retired_executions',
        sa.Column('execution_id', sa.Text(), nullable=False),
        sa.Column('last_token', sa.BigInteger(), nullable=False),
        sa.Column('workflow_id', sa.Text(), nullable=True),
        sa.Column('retired_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('execution_id', name=op.f('pk_retired_executions')),
    )
    op.add_column('executions', sa.Column('integrity_conflicts', sa.Integer(),
                                          server_default=sa.text('0'), nullable=False))
    op.add_column('late_observations', sa.Column('conflict', sa.Boolean(), nullable=True))
    op.execute(DETACH_DUPLICATE_CHILDREN)
    op.create_index('ux_executions_parent_step', 'executions',
                    ['parent_execution_id', 'parent_step_key'], unique=True,
                    postgresql_where=sa.text('parent_execution_id IS NOT NULL'))


def downgrade() -> None:
    # Detached links are not restored: 0001 does not need them.
    op.drop_index('ux_executions_parent_step', table_name='executions',
                  postgresql_where=sa.text('parent_execution_id IS NOT NULL'))
    op.drop_column('late_observations', 'conflict')
    op.drop_column('executions', 'integrity_conflicts')
    op.drop_table('retired_executions')
