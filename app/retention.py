"""Retention: a maintenance service that deletes terminal executions older
than FENCEPOST_RETENTION, in batches, with their steps, events, signals,
effects and late observations. Nothing that is not terminal is ever deleted.
Each deleted execution leaves a tombstone in `retired_executions` (ID, last
fencing token, workflow), written by the deleting statement: an execution ID
is never reused, however long ago its record was pruned."""

from __future__ import annotations

import asyncio
import logging

from app.maintenance import Leadership, every
from app.metrics import METRICS
from app.store import ExecutionStore

log = logging.getLogger("fencepost.retention")


class RetentionPruner:
    def __init__(self, store: ExecutionStore, *, retention_seconds: float,
                 interval: float = 60.0, batch: int = 500):
        if retention_seconds <= 0 or interval <= 0 or batch <= 0:
            raise ValueError("retention, interval and batch must be positive")
        self.store = store
        self.retention_seconds = retention_seconds
        self.interval = interval
        self.batch = batch

    async def run_once(self) -> int:
        """Prune until a batch comes back short; returns how many were deleted."""
        total = 0
        while True:
            n = await self.store.history.prune_terminal(self.retention_seconds, self.batch)
            METRICS.pruned.inc(n)
            total += n
            if n < self.batch:
                METRICS.maintained("retention")
                return total

    async def sweep(self) -> None:
        deleted = await self.run_once()
        if deleted:
            log.info("retention: deleted %d terminal executions", deleted)

    async def run(self, stop: asyncio.Event, leadership: Leadership | None = None) -> None:
        """Sweep every interval until `stop` (only while leading, with `leadership`)."""
        await every(self.interval, stop, self.sweep, leadership)
