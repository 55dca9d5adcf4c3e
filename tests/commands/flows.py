"""Workflows for the commands' tests: one that records a step and waits for
a signal only an operate token may send, one that completes after a step,
and one with typed params."""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Amount(BaseModel):
    amount: int


def _one() -> int:
    return 1


@workflow("cmd-wait", signals={"approve": "operate"})
async def wait(ctx: WorkflowContext, params) -> object:
    await ctx.step("prep", _one)
    return await ctx.wait_for_signal("approve")


@workflow("cmd-done")
async def done(ctx: WorkflowContext, params) -> int:
    return await ctx.step("prep", _one)


@workflow("cmd-typed", params=Amount)
async def typed(ctx: WorkflowContext, params: Amount) -> int:
    return params.amount
