"""The expired-lease reaper: a small maintenance service.

`run_once()` ends leases whose expiry has passed (see
`store.leases.reap_expired`: status back, counter +1, redelivery delay; or
cancelled / timed out / parked as poison, as the rules say) and times out
unheld executions whose deadline passed; `run()` only sleeps and calls it.
Claims take over expired leases on their own, so the reaper exists to make
the record say so promptly when no worker is claiming. Reads never wait for
it: app/store/types.py's record_columns reports every record as `run_once`
will leave it (same rules, same outcomes), so the API, the dashboard and the
metrics agree before and after it runs. `fencepost_lease_takeovers_total`
counts the leases it ends (by="reaper") and those a claim takes over
(by="claim"), each where the store writes it.
"""

from __future__ import annotations

import asyncio
import logging

from app.maintenance import Leadership, every
from app.metrics import METRICS
from app.store import ExecutionStore, ReapResult

log = logging.getLogger("fencepost.reaper")


class LeaseReaper:
    def __init__(self, store: ExecutionStore, *, interval: float = 1.0, batch: int = 500):
        if interval <= 0 or batch <= 0:
            raise ValueError("reaper interval and batch must be positive")
        self.store = store
        self.interval = interval
        self.batch = batch

    async def run_once(self) -> ReapResult:
        """Reap until a round comes back short; returns the leases ended.
        Then end the unheld executions a cancel or the deadline left with no
        cleanup to run (see store.leases.sweep_interrupted). On Citus a round
        visits every shard, each up to `batch`: short means under `batch` in all."""
        ids: list[str] = []
        while True:
            result = await self.store.leases.reap_expired(self.batch)  # counts its takeovers
            ids.extend(result.execution_ids)
            if result.expired < self.batch:
                break
        while len(await self.store.leases.sweep_interrupted(self.batch)) >= self.batch:
            pass
        METRICS.maintained("reaper")
        return ReapResult(len(ids), ids)

    async def sweep(self) -> None:
        result = await self.run_once()
        if result.expired:
            log.info("reaped %d expired leases", result.expired)

    async def run(self, stop: asyncio.Event, leadership: Leadership | None = None) -> None:
        """Sweep every interval until `stop` (only while leading, with `leadership`)."""
        await every(self.interval, stop, self.sweep, leadership)
