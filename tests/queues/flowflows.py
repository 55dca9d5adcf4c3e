"""Workflows run by real `fencepost worker` processes in the flow-control
tests (`--workflows tests.queues.flowflows`), one per queue under test.

Each execution's one step is a transactional step that reads Postgres's
`clock_timestamp()` when it begins and when it ends: one clock for every
worker process, read inside the delivery's own fenced transaction, so the
recorded interval lies within the time the execution held its slot (from its
claim to its acknowledgement). Only the delivery whose lease held records
the interval (a stale one is rolled back), so the recorded intervals are what
the tests compare for overlap.

params: {"seconds": float (how long the step takes),
         "first_seconds": float (instead, on the first delivery: a worker
         killed there leaves the slot held until its lease expires)}
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from app.queues import Queue
from app.sdk import WorkflowContext, workflow

CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"


async def timed(conn: Any, seconds: float) -> dict:
    start = await conn.fetchval(CLOCK)
    await asyncio.sleep(seconds)
    end = await conn.fetchval(CLOCK)
    return {"start": start, "end": end, "pid": os.getpid()}


async def _work(ctx: WorkflowContext, params: dict) -> dict:
    seconds = float(params.get("seconds", 0.0))
    if ctx.attempt == 1 and "first_seconds" in params:
        seconds = float(params["first_seconds"])
    return await ctx.transaction("work", timed, seconds)


@workflow("flow-q3", queue=Queue("q3", concurrency=3))
async def flow_q3(ctx: WorkflowContext, params: dict) -> dict:
    return await _work(ctx, params)


@workflow("flow-keyed", queue=Queue("keyed", per_key_concurrency=1), concurrency_key="key")
async def flow_keyed(ctx: WorkflowContext, params: dict) -> dict:
    return await _work(ctx, params)


@workflow("flow-rated", queue=Queue("rated", rate_limit=(10, 1.0)))
async def flow_rated(ctx: WorkflowContext, params: dict) -> dict:
    return await _work(ctx, params)


@workflow("flow-one", queue=Queue("one", concurrency=1))
async def flow_one(ctx: WorkflowContext, params: dict) -> dict:
    return await _work(ctx, params)
