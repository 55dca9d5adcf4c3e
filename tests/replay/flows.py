"""The workflows real in-process workers run to record the histories the
replay tests check (IDs prefixed `rp-`); `rp-order` is variants.recorded."""

from __future__ import annotations

import asyncio
from typing import Any

from app.sdk import WorkflowContext, workflow
from tests.replay import variants
from tests.replay.steps import wrap


@workflow("rp-order")
async def order(ctx: WorkflowContext, params: dict) -> Any:
    return await variants.recorded(ctx, params)


@workflow("rp-child")
async def child(ctx: WorkflowContext, params: dict) -> Any:
    return await ctx.step("wrap", wrap)


@workflow("rp-short")
async def short(ctx: WorkflowContext, params: dict) -> Any:
    first = await ctx.step("first", wrap)
    return [first, await ctx.step("second", wrap)]


@workflow("rp-signal")
async def signalled(ctx: WorkflowContext, params: dict) -> Any:
    first = await ctx.wait_for_signal("go")
    second = await ctx.wait_for_signal("again", timeout=3600)
    return [first, second]


@workflow("rp-gather")
async def gathered(ctx: WorkflowContext, params: dict) -> Any:
    both = await asyncio.gather(ctx.step("left", wrap), ctx.step("right", wrap))
    await ctx.sleep("nap", 3600)
    return both
