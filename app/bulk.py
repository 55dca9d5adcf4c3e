"""Bulk operations, the worker's side: a maintenance service that carries out
pending items of running operations in bounded batches (see
app/store/bulk.py for why a crash or a second worker repeats nothing)."""

from __future__ import annotations

import asyncio
import logging

from app.maintenance import Leadership, every
from app.store import ExecutionStore

log = logging.getLogger("fencepost.operations")


class OperationRunner:
    def __init__(self, store: ExecutionStore, *, interval: float = 1.0, batch: int = 50):
        if interval <= 0 or batch <= 0:
            raise ValueError("interval and batch must be positive")
        self.store = store
        self.interval = interval
        self.batch = batch

    async def run_once(self) -> int:
        """Batches until one comes back short; returns the items carried out."""
        total = 0
        while True:
            n = await self.store.operations.run_operation_batch(self.batch)
            total += n
            if n < self.batch:
                return total

    async def sweep(self) -> None:
        done = await self.run_once()
        if done:
            log.info("operations: carried out %d items", done)

    async def run(self, stop: asyncio.Event, leadership: Leadership | None = None) -> None:
        """Sweep every interval until `stop` (only while leading, with `leadership`)."""
        await every(self.interval, stop, self.sweep, leadership)
