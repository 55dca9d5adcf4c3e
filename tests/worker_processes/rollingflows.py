"""Workflows for the rolling-deploy test (`--workflows
tests.worker_processes.rollingflows`), run by real `fencepost worker` and
`fencepost api` processes. Which code version this process carries is read
at import from ROLL_CODE_VERSION (default "1"), as a deploy ships new code:
`roll-deploy` is versioned with it, `roll-any` is unversioned. Every step
returns the version and pid of the process that ran it, so the recorded
values name the code that ran each step. A process started with
ROLL_BLOCK_SECONDS blocks that long in every step it runs (a worker to kill
while it holds a lease)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from app.sdk import WorkflowContext, workflow

CODE_VERSION = os.environ.get("ROLL_CODE_VERSION", "1")


async def ran_here(step: str) -> dict:
    await asyncio.sleep(float(os.environ.get("ROLL_BLOCK_SECONDS", "0")))
    return {"step": step, "version": CODE_VERSION, "pid": os.getpid()}


@workflow("roll-deploy", version=CODE_VERSION)
async def deploy(ctx: WorkflowContext, params: Any) -> dict:
    """A step, a wait for signal `go` (days, in production), another step."""
    first = await ctx.step("first", ran_here, "first")
    await ctx.wait_for_signal("go")
    second = await ctx.step("second", ran_here, "second")
    return {"first": first, "second": second}


@workflow("roll-any")
async def anywhere(ctx: WorkflowContext, params: Any) -> dict:
    """Unversioned: any worker carrying it may run it."""
    return await ctx.step("only", ran_here, "only")
