"""The workflows `fencepost bench` runs: three recorded steps, no waiting;
for `--queues`, the same three steps on a queue limited per concurrency key
and on one with no limit at all."""

from __future__ import annotations

from app.queues import Queue
from app.sdk import WorkflowContext, workflow

# `fencepost bench --queues` compares these two queues. The per-key limit is
# set at run time, for the limited run only: a claim locks every limited
# queue, so a limit declared here would weigh on the unlimited run as well.
KEYED_QUEUE = Queue("bench-keyed")
FREE_QUEUE = Queue("bench-free")


async def _double(n: int) -> int:
    return n * 2


async def _three(ctx: WorkflowContext, params: dict) -> dict:
    a = await ctx.step("one", _double, params.get("n", 1))
    b = await ctx.step("two", _double, a)
    c = await ctx.step("three", _double, b)
    return {"n": c}


@workflow("bench-3-steps")
async def three_steps(ctx: WorkflowContext, params: dict) -> dict:
    return await _three(ctx, params)


@workflow("bench-keyed", queue=KEYED_QUEUE, concurrency_key="key")
async def keyed(ctx: WorkflowContext, params: dict) -> dict:
    return await _three(ctx, params)


@workflow("bench-free", queue=FREE_QUEUE)
async def free(ctx: WorkflowContext, params: dict) -> dict:
    return await _three(ctx, params)


@workflow("bench-timer")
async def timer(ctx: WorkflowContext, params: dict) -> dict:
    """`fencepost bench --timers`: one durable sleep, then done."""
    await ctx.sleep("wait", float(params["seconds"]))
    return {}
