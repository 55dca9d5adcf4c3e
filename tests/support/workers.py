"""In-process workers for tests: real `Worker(...).run()` coroutines as
asyncio tasks in the test's event loop, stopped (and awaited) after the test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.registry import WorkflowDefinition
from app.settings import Settings
from app.worker import Worker


class InProcessWorkers:
    def __init__(self, settings: Settings, workflows: dict[str, WorkflowDefinition], *,
                 default_concurrency: int = 4, before_stop: Callable[[], None] | None = None):
        self.settings = settings
        self.workflows = workflows
        self.default_concurrency = default_concurrency
        self.before_stop = before_stop  # e.g. open every gate a delivery may wait on
        self.tasks: dict[Worker, asyncio.Task] = {}

    async def start(self, concurrency: int | None = None, workflows=None, **overrides) -> Worker:
        """Start a worker (settings overridden by keyword) and return once it
        is running (registered: its store exists)."""
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        worker = Worker(settings, workflows or self.workflows,
                        concurrency=concurrency or self.default_concurrency)
        task = asyncio.create_task(worker.run(), name=f"worker {worker.worker_id}")
        self.tasks[worker] = task
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while worker.store is None:
            if task.done():
                task.result()  # raises what killed it
            assert loop.time() < deadline, "worker did not start"
            await asyncio.sleep(0.01)
        return worker

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
