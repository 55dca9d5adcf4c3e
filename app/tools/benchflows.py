"""The workflow `fencepost bench` runs: three recorded steps, no waiting."""

from __future__ import annotations

from app.sdk import WorkflowContext, workflow


async def _double(n: int) -> int:
    return n * 2


@workflow("bench-3-steps")
async def three_steps(ctx: WorkflowContext, params: dict) -> dict:
    a = await ctx.step("one", _double, params.get("n", 1))
    b = await ctx.step("two", _double, a)
    c = await ctx.step("three", _double, b)
    return {"n": c}
