"""Placement: where the buckets live, and which to claim from next.

On one Postgres every bucket is in one place: a claim scans them all in one
statement. On Citus (app/citus.py) the buckets are spread over shards; a claim
is routed to one shard only when it names buckets of that shard alone, so a
claimer claims shard by shard: its `Placement.groups` are the buckets of each
shard, read from Citus once per pool. `ClaimRotation` decides which groups a
claim visits, so that idle groups cost nothing between polls and a busy group
does not starve the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from app.store.buckets import BUCKETS


@dataclass(frozen=True)
class Placement:
    """None of it on one Postgres (`groups` empty): everything in one place."""

    groups: tuple[tuple[int, ...], ...] = ()

    @property
    def distributed(self) -> bool:
        return bool(self.groups)


SINGLE_NODE = Placement()

_PLACEMENT_SQL = f"""
SELECT get_shard_id_for_distribution_column('executions', b::smallint) AS shard,
       array_agg(b ORDER BY b) AS buckets
FROM generate_series(0, {BUCKETS - 1}) AS b
GROUP BY 1 ORDER BY 1
"""


async def read_placement(db: Any) -> Placement:
    """The groups of buckets that share a shard, from Citus' metadata; one
    Postgres (no citus, or executions not distributed): SINGLE_NODE."""
    distributed = await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') "
        "AND to_regclass('pg_dist_partition') IS NOT NULL")
    if distributed:
        distributed = await db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition "
            "WHERE logicalrelid = 'executions'::regclass)")
    if not distributed:
        return SINGLE_NODE
    rows = await db.fetch(_PLACEMENT_SQL)
    return Placement(tuple(tuple(r["buckets"]) for r in rows))


async def placement_of(db: Any) -> Placement:
    """The placement behind a store handle, read once per pool (cached on it)
    and on every call for a connection handle (it is rare there)."""
    cached: Placement | None = getattr(db, "_fencepost_placement", None)
    if cached is not None:
        return cached
    placement = await read_placement(db)
    try:
        db._fencepost_placement = placement
    except AttributeError:  # a handle that takes no attributes: read again next time
        pass
    return placement


@dataclass
class ClaimRotation:
    """Which shard groups a claim visits next (Citus only).

    A group whose last claim found nothing due is skipped until the earliest
    due time that claim told of, or until `recheck_seconds` have passed
    (what no claim can foresee: an admission, a wake, a lease expiring); a
    wake-up (`wake()`) makes every group eligible again. Each claim starts
    one group further along, so a busy group does not hold the others back.
    """

    groups: tuple[tuple[int, ...], ...]
    recheck_seconds: float = 1.0
    _idle_until: dict[int, float] = field(default_factory=dict)
    _start: int = 0

    def wake(self) -> None:
        self._idle_until.clear()

    def order(self) -> list[int]:
        """Indexes of the groups to visit now, in visiting order."""
        now = asyncio.get_running_loop().time()
        n = len(self.groups)
        start, self._start = self._start, (self._start + 1) % max(n, 1)
        return [i for i in ((start + k) % n for k in range(n))
                if self._idle_until.get(i, 0.0) <= now]

    def found(self, group: int, claimed: int, next_due_in: float | None) -> None:
        """What a claim on `group` found: `claimed` executions, and the
        earliest due time still to come there (seconds; None: none)."""
        if claimed:
            self._idle_until.pop(group, None)
            return
        wait = self.recheck_seconds if next_due_in is None else min(
            self.recheck_seconds, max(0.0, next_due_in))
        self._idle_until[group] = asyncio.get_running_loop().time() + wait
