"""Workflows for the harness tests (besides app.examples)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from app.sdk import WorkflowContext, workflow


def send_reminder(n: int) -> str:
    return f"reminder {n}"


@workflow("testing-sleepy")
async def sleepy(ctx: WorkflowContext, params: dict) -> dict:
    await ctx.sleep("a-day", timedelta(days=1))
    first = await ctx.step("remind-1", send_reminder, 1)
    await ctx.sleep("a-month", timedelta(days=30))
    second = await ctx.step("remind-2", send_reminder, 2)
    return {"sent": [first, second]}


@workflow("testing-deadline", timeout=timedelta(days=7))
async def deadline_bound(ctx: WorkflowContext, params: dict) -> dict:
    await ctx.wait_for_signal("never")
    return {"unreachable": True}


def double(x: int) -> int:
    return 2 * x


@workflow("testing-gather")
async def gather(ctx: WorkflowContext, params: dict) -> list:
    return list(await asyncio.gather(*(ctx.step(f"double-{i}", double, i) for i in range(5))))


@workflow("testing-child")
async def child(ctx: WorkflowContext, params: dict) -> int:
    await ctx.sleep("think", timedelta(hours=params["hours"]))
    return await ctx.step("square", double, params["n"])


@workflow("testing-fanout")
async def fanout(ctx: WorkflowContext, params: dict) -> list:
    ids = await asyncio.gather(*(ctx.start_child(f"child-{i}", "testing-child",
                                                 {"n": i, "hours": i + 1}) for i in range(4)))
    return list(await asyncio.gather(*(ctx.wait_for_child(f"wait-{i}", cid)
                                       for i, cid in enumerate(ids))))
