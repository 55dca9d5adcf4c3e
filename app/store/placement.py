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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar, cast

from app.store.buckets import BUCKETS, bucket_of
from app.store.handle import PlacementCache, StoreObject
from app.store.on_shard import send_notices
from app.store.types import NOTIFY_CHANNEL

T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True)
class Placement:
    """None of it on one Postgres (`groups` empty): everything in one place."""

    groups: tuple[tuple[int, ...], ...] = ()
    # The node (Citus group ID) holding each group's shard; () when unknown
    # (all taken as one node).
    nodes: tuple[int, ...] = ()

    @property
    def distributed(self) -> bool:
        return bool(self.groups)

    @cached_property
    def group_of(self) -> dict[int, int]:
        """Each bucket's group (index in `groups`)."""
        return {b: i for i, group in enumerate(self.groups) for b in group}

    def by_node(self, order: Sequence[int]) -> list[list[int]]:
        """The group indexes of `order`, in runs of one node each (nodes in
        the order `order` first reaches them)."""
        runs: dict[int, list[int]] = {}
        for index in order:
            runs.setdefault(self.nodes[index] if self.nodes else 0, []).append(index)
        return list(runs.values())

    def each_shard(self) -> list[list[int] | None]:
        """The buckets a sweep visits in turn: all at once on one Postgres
        (None), one shard's at a time on Citus."""
        if not self.distributed:
            return [None]
        return [list(group) for group in self.groups]

    async def per_shard(self, items: Sequence[T], execution_id: Callable[[T], str],
                        run: Callable[[list[T], list[int] | None], Awaitable[list[A]]], *,
                        on_error: Callable[[list[T], BaseException], list[A]] | None = None,
                        at_once: bool = False) -> list[A]:
        """`run(items, None)` on one Postgres; on Citus `run(part, buckets)`
        for the items of each shard (`buckets`: theirs, all of that shard),
        the answers in the items' order: all parts at once with `at_once`
        (each `run` on a pool connection of its own: the caller's statements
        are on the pool), else one shard after the other (they share the
        caller's connection). On Citus each part commits on its own: a part
        that raised is answered by `on_error(part, exception)` (None: every
        part runs, then the first error is raised).

        (Parts at once once timed out: the new connections' type lookups
        queued on the coordinator. That lookup took 730 ms a connection on
        Citus until the pools read the catalog with shards visible, app/db.py;
        it takes 11 ms now.)"""
        if not self.distributed:
            return await run(list(items), None)
        parts: dict[int, list[int]] = {}
        buckets = [bucket_of(execution_id(item)) for item in items]
        for i, bucket in enumerate(buckets):
            parts.setdefault(self.group_of[bucket], []).append(i)
        answers: list[A | None] = [None] * len(items)
        calls = [(indexes, [buckets[i] for i in indexes]) for indexes in parts.values()]
        results: list[Any]
        if at_once:
            results = list(await asyncio.gather(
                *(run([items[i] for i in indexes], part_buckets)
                  for indexes, part_buckets in calls), return_exceptions=True))
            for got in results:
                if isinstance(got, BaseException) and not isinstance(got, Exception):
                    raise got  # a cancellation, not a part's answer
        else:
            results = []
            for indexes, part_buckets in calls:
                try:
                    results.append(await run([items[i] for i in indexes], part_buckets))
                except Exception as exc:
                    results.append(exc)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed and on_error is None:
            raise failed[0]
        results = [on_error([items[i] for i in indexes], got)
                   if on_error is not None and isinstance(got, BaseException) else got
                   for (indexes, _), got in zip(calls, results, strict=True)]
        for (indexes, _), got in zip(calls, results, strict=True):
            for i, answer in zip(indexes, got, strict=True):
                answers[i] = answer
        return cast("list[A]", answers)


SINGLE_NODE = Placement()

_PLACEMENT_SQL = f"""
SELECT s.shard, s.buckets, p.groupid AS node
FROM (SELECT get_shard_id_for_distribution_column('executions', b::smallint) AS shard,
             array_agg(b ORDER BY b) AS buckets
      FROM generate_series(0, {BUCKETS - 1}) AS b
      GROUP BY 1) s
JOIN pg_dist_placement p ON p.shardid = s.shard
ORDER BY s.shard
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
    return Placement(tuple(tuple(r["buckets"]) for r in rows),
                     tuple(r["node"] for r in rows))


async def placement_of(db: Any, cache: PlacementCache) -> Placement:
    """The placement behind a store (read once, kept in its config's cache)."""
    if cache.placement is None:
        cache.placement = await read_placement(db)
    placement: Placement = cache.placement
    return placement


async def shard_buckets(store: StoreObject, execution_id: str,
                        db: Any = None) -> list[int] | None:
    """The `buckets` of an `OnShard` statement on one execution's rows: its
    bucket on Citus, None on one Postgres. Inside a transaction pass its
    connection as `db`: read on the store's pool, the first call would wait
    for a second pooled connection while holding one."""
    placement = await placement_of(db or store.db, store.config.placement)
    return [bucket_of(execution_id)] if placement.distributed else None


async def tell_claimers(db: Any, buckets: list[int] | None) -> None:
    """After an `OnShard` statement on `buckets` that made work due now,
    NOTIFY the claimers on `db` (a connection to the coordinator, where they
    listen). On Citus (`buckets` given) the statement's own NOTIFY ran on the
    worker node holding its rows, where no one listens; on one Postgres
    (`buckets` None) it was enough."""
    if buckets is not None:
        await send_notices(db, [(NOTIFY_CHANNEL, "")])


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
