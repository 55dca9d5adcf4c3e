"""Buckets: the routing key of everything that belongs to one execution.

An execution's bucket is a fixed hash of its ID (migration 0010 defines the
same function in SQL, `fencepost_bucket`); every row of that execution in
every per-execution table carries it. On Citus the bucket is the distribution
column: a statement that names `bucket = fencepost_bucket($id)` (the function is
IMMUTABLE, so it is folded to a constant before routing) reaches one shard.
"""

from __future__ import annotations

from hashlib import md5

# Fixed by migration 0010 for the life of a database: changing it would move every row.
BUCKETS = 256


def bucket_of(execution_id: str) -> int:
    """The bucket of `execution_id`, equal to SQL `fencepost_bucket(execution_id)`
    (the low 31 bits of the first 32 of the md5 of its UTF-8 bytes, modulo BUCKETS)."""
    first = int(md5(execution_id.encode("utf-8"), usedforsecurity=False).hexdigest()[:8], 16)
    return (first & 0x7FFFFFFF) % BUCKETS

# The tables holding the rows of one execution, each with its `bucket`
# (executions first: the others reference it).
PER_EXECUTION = (
    "executions", "execution_steps", "execution_events", "late_observations",
    "retired_executions", "signals", "effects", "attempt_history", "superseded_steps",
    "watched_executions",
)
