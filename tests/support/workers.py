"""In-process workers for tests: real `Worker(...).run()` coroutines as
asyncio tasks in the test's event loop, stopped (and awaited) after the test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.registry import WorkflowDefinition
from app.settings import Settings
from app.worker import Worker
from tests.support.waiting import wait_until


class InProcessWorkers:
    def __init__(self, settings: Settings, workflows: dict[str, WorkflowDefinition], *,
                 default_concurrency: int = 4, before_stop: Callable[[], None] | None = None):
        self.settings = settings
        self.workflows = workflows
        self.default_concurrency = default_concurrency
        self.before_stop = before_stop  # e.g. open every gate a delivery may wait on
        self.tasks: dict[Worker, asyncio.Task] = {}
        self.rounds: dict[Worker, int] = {}  # claim rounds finished, per worker

    async def start(self, concurrency: int | None = None, workflows=None, **overrides) -> Worker:
        """Start a worker (settings overridden by keyword) and return once it
        is running (registered: its store exists)."""
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        worker = Worker(settings, workflows or self.workflows,
                        concurrency=concurrency or self.default_concurrency)
        task = asyncio.create_task(worker.run(), name=f"worker {worker.worker_id}")
        self.tasks[worker] = task

        def running() -> bool:
            if task.done():
                task.result()  # raises what killed it
            return worker.store is not None

        await wait_until(running, timeout=10, interval=0.01, what="the worker started")
        self._count_claim_rounds(worker)
        return worker

    def _count_claim_rounds(self, worker: Worker) -> None:
        self.rounds[worker] = 0
        claim_due = worker.store.leases.claim_due

        async def counted(*args, **kwargs):
            try:
                return await claim_due(*args, **kwargs)
            finally:
                self.rounds[worker] += 1

        worker.store.leases.claim_due = counted  # type: ignore[method-assign]

    async def claim_rounds(self, n: int = 2, *, timeout: float = 10.0) -> None:
        """Return once every running worker has finished `n` more claim rounds
        (looked for due executions `n` more times): "nobody claims it" is then
        shown by the workers having looked, not by time having passed."""
        start = {worker: self.rounds[worker] for worker in self.tasks}
        await wait_until(lambda: all(self.rounds[w] >= start[w] + n for w in start),
                         timeout=timeout, what=f"{n} more claim rounds of every worker")

    async def stop(self, worker: Worker, timeout: float = 10.0) -> None:
        worker.request_stop()
        await asyncio.wait_for(self.tasks.pop(worker), timeout=timeout)

    async def stop_all(self) -> None:
        if self.before_stop is not None:
            self.before_stop()
        first: BaseException | None = None
        for worker in list(self.tasks):
            try:
                await self.stop(worker)
            except Exception as exc:  # keep stopping the others
                first = first or exc
        if first is not None:
            raise first
