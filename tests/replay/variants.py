"""Workflow code for `rp-order` as it was recorded (`recorded`) and as later
deploys change it. Plain functions: flows.py registers `recorded`; the
in-process tests replay the others through `definition(...)`, and the
deploy_*.py modules register one each for a `fencepost replay` subprocess.

`recorded` asks, in order: reserve, charge (effect), book (transaction),
kid (child start), kid-done (child wait), nap (an hour's sleep: the
execution suspends there), then ship.
"""

from __future__ import annotations

from typing import Any

from app.sdk import WorkflowContext
from tests.replay.steps import audit, book, charge, fraud_check, reserve, ship


async def _child(ctx: WorkflowContext) -> Any:
    kid = await ctx.start_child("kid", "rp-child", {})
    return await ctx.wait_for_child("kid-done", kid)


async def recorded(ctx: WorkflowContext, params: dict) -> Any:
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.effect("charge", charge, amount)
    await ctx.transaction("book", book)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    return await ctx.step("ship", ship)


async def appended(ctx: WorkflowContext, params: dict) -> Any:
    """Compatible: a new step after the recorded ones."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.effect("charge", charge, amount)
    await ctx.transaction("book", book)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    await ctx.step("audit", audit)
    return await ctx.step("ship", ship)


async def patched(ctx: WorkflowContext, params: dict) -> Any:
    """Compatible: a fraud check behind a patch, before recorded steps."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    if await ctx.patched("fraud-check"):
        await ctx.step("fraud", fraud_check, amount)
    await ctx.effect("charge", charge, amount)
    await ctx.transaction("book", book)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    return await ctx.step("ship", ship)


async def inserted(ctx: WorkflowContext, params: dict) -> Any:
    """A new step before recorded ones (position 1: recorded charge)."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.step("fraud", fraud_check, amount)
    await ctx.effect("charge", charge, amount)
    await ctx.transaction("book", book)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    return await ctx.step("ship", ship)


async def removed(ctx: WorkflowContext, params: dict) -> Any:
    """The transaction removed (position 2: recorded book, now kid)."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.effect("charge", charge, amount)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    return await ctx.step("ship", ship)


async def reordered(ctx: WorkflowContext, params: dict) -> Any:
    """The transaction before the effect (position 1: recorded charge, now book)."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.transaction("book", book)
    await ctx.effect("charge", charge, amount)
    await _child(ctx)
    await ctx.sleep("nap", 3600)
    return await ctx.step("ship", ship)


async def returns_early(ctx: WorkflowContext, params: dict) -> Any:
    """Returns before recorded steps: kid, kid-done and nap are no longer reached."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    await ctx.effect("charge", charge, amount)
    await ctx.transaction("book", book)
    return "done early"


async def swallows(ctx: WorkflowContext, params: dict) -> Any:
    """An inserted step whose divergence the code tries to swallow."""
    amount = await ctx.step("reserve", reserve, params.get("n", 1))
    try:
        await ctx.step("fraud", fraud_check, amount)
    except BaseException:  # noqa: BLE001 - the test: the latch stands
        pass
    return amount
