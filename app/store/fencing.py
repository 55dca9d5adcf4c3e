"""The fence: every write a lease holder makes carries its lease's token and
is refused unless that token is still current and the execution `running`
(checked and written in one statement, under the execution row's lock).

A refused write changes nothing, and each refusal leaves exactly one
`fenced_write_rejected` event in the history (written by `rejected` below,
after the refused statement, so a refusal inside a transaction that rolls
back is still recorded), and the holder gets `LeaseLost`. A renewal that
finds its lease gone records `renewal_lost` instead (app/store/leases.py):
the holder made no write, it learns it must stop.
"""

from __future__ import annotations

from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, OnShard
from app.store.placement import shard_buckets
from app.store.types import Lease, LeaseLost


def interrupt_at(now: str) -> str:
    """Selected by every fence: tells the current holder to stop at this
    step. `now`: the statement's time (in an UPDATE's RETURNING, the
    `updated_at` it just wrote: Citus refuses now() there)."""
    return (f"CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancel' "
            f"WHEN deadline <= {now} THEN 'deadline' END AS interrupt")


INTERRUPT_SQL = interrupt_at("now()")

# THE fence of one write by the holder of token $2 of execution $1, as the
# first CTE of the write's statement: the row, still running under that
# token, updated (so locked to the end of the statement's transaction, and
# re-checked on its latest version if it changed since the statement's
# snapshot), so no claim (which takes the row FOR UPDATE and moves the
# token) can land between this check and the write. The update takes the
# place of the write's event in the history (`event_seq`; unused when the
# write turns out to write nothing). An empty `fence` means the write must
# write nothing; its `interrupt` is a pending cancel or a passed deadline.
FENCE_CTE = f"""fence AS (
    UPDATE executions SET event_seq = event_seq + 1
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND token = $2 AND status = 'running'
    RETURNING execution_id, event_seq, {INTERRUPT_SQL}
)"""


# The refusal's event, its place taken on the execution's row (none when the
# row is gone: retention deleted the execution and its history).
_REJECTED = OnShard("fenced_write_rejected", """
WITH placed AS (
    UPDATE executions SET event_seq = event_seq + 1
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
    RETURNING event_seq
)
INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
SELECT """ + NEXT_EVENT_ID + """, $1, fencepost_bucket($1), event_seq, 'fenced_write_rejected',
       $2, jsonb_build_object('stepKey', $3::text)
FROM placed
RETURNING event_id
""", ("text", "bigint", "text"), (("event_id", "bigint"),))


async def rejected(store: StoreObject, lease: Lease, step_key: str | None = None) -> LeaseLost:
    """Record that a write under `lease` was refused by the fence and return
    the LeaseLost to raise. `step_key`: the step the write was for (None for
    the writes that end a delivery: acknowledge, release)."""
    await _REJECTED.fetch(store.db, await shard_buckets(store, lease.execution_id),
                          lease.execution_id, lease.token, step_key)
    return LeaseLost(lease.execution_id, lease.token)
