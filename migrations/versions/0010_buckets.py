"""buckets: a routing key on every per-execution table

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 11:00:00

Every row that belongs to one execution carries `bucket`, a fixed hash of its
execution ID (`fencepost_bucket(execution_id)`, 0..255), and the bucket is part
of its primary key and of its foreign keys to `executions`. On one Postgres the
bucket is just a column; on Citus (`fencepost migrate --citus`) it is the
distribution column, so a statement that names an execution's bucket reaches
the one shard holding everything of that execution.

The hash is md5-based so that the application computes the same value
(`app.store.buckets.bucket_of`); a CHECK keeps every row's bucket equal to the
hash of its execution ID, so no row can sit in another execution's bucket.
The number of buckets (256) is fixed here for good: changing it would move
every row. Existing rows are backfilled.
"""

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

BUCKETS = 256  # app.store.buckets.BUCKETS: both fixed for good

# Tables holding one execution's rows: (table, primary key after this revision).
_PER_EXECUTION = (
    ('executions', ('execution_id', 'bucket')),
    ('execution_steps', ('execution_id', 'step_key', 'bucket')),
    ('execution_events', ('event_id', 'bucket')),
    ('late_observations', ('observation_id', 'bucket')),
    ('retired_executions', ('execution_id', 'bucket')),
    ('signals', ('signal_id', 'bucket')),
    ('effects', ('execution_id', 'step_key', 'bucket')),
    ('attempt_history', ('attempt_id', 'bucket')),
    ('superseded_steps', ('superseded_id', 'bucket')),
    ('watched_executions', ('execution_id', 'bucket')),
)
# Tables whose rows reference their execution's row (deleted with it).
_REFERENCING = ('execution_steps', 'signals', 'effects', 'attempt_history',
                'superseded_steps', 'watched_executions')

# The low 31 bits of the first 32 of the ID's md5, modulo the bucket count:
# IMMUTABLE, so a predicate `bucket = fencepost_bucket($1)` is folded to a
# constant at planning (Citus routes on it) and may sit in a CHECK.
BUCKET_FUNCTION = f"""
CREATE OR REPLACE FUNCTION fencepost_bucket(execution_id text) RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT (((('x' || substr(md5(execution_id), 1, 8))::bit(32)::int) & 2147483647)
            % {BUCKETS})::smallint
$$
"""


def upgrade() -> None:
    op.execute(BUCKET_FUNCTION)
    for table in _REFERENCING:
        op.drop_constraint(f'fk_{table}_execution_id', table, type_='foreignkey')
    for table, key in _PER_EXECUTION:
        op.execute(f"ALTER TABLE {table} ADD COLUMN bucket smallint")
        op.execute(f"UPDATE {table} SET bucket = fencepost_bucket(execution_id)")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN bucket SET NOT NULL")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_bucket_of_execution "
                   f"CHECK (bucket = fencepost_bucket(execution_id))")
        op.drop_constraint(f'pk_{table}', table, type_='primary')
        op.create_primary_key(f'pk_{table}', table, list(key))
    for table in _REFERENCING:
        op.create_foreign_key(f'fk_{table}_execution_id', table, 'executions',
                              ['execution_id', 'bucket'], ['execution_id', 'bucket'],
                              ondelete='CASCADE')


def downgrade() -> None:
    for table in _REFERENCING:
        op.drop_constraint(f'fk_{table}_execution_id', table, type_='foreignkey')
    for table, key in _PER_EXECUTION:
        op.drop_constraint(f'pk_{table}', table, type_='primary')
        op.create_primary_key(f'pk_{table}', table, [c for c in key if c != 'bucket'])
        op.execute(f"ALTER TABLE {table} DROP COLUMN bucket")
    for table in _REFERENCING:
        op.create_foreign_key(f'fk_{table}_execution_id', table, 'executions',
                              ['execution_id'], ['execution_id'], ondelete='CASCADE')
    op.execute("DROP FUNCTION fencepost_bucket(text)")
