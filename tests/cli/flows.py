"""Workflows the operator CLI tests run on real workers."""

from __future__ import annotations

from typing import Any

from app.sdk import WorkflowContext, workflow


def _echo(value: Any) -> Any:
    return value


@workflow("cli-echo")
async def echo(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.step("echo", _echo, params)


@workflow("cli-approval")
async def approval(ctx: WorkflowContext, params: Any) -> Any:
    decision = await ctx.wait_for_signal("approve")
    return {"approved": decision}


# The outside condition a redrive waits for: tests switch it off.
BROKEN = {"charge": True}


def _charge(order: Any) -> dict:
    if BROKEN["charge"]:
        raise RuntimeError("the payment provider is down")
    return {"charged": order}


@workflow("cli-flaky")
async def flaky(ctx: WorkflowContext, params: Any) -> Any:
    order = await ctx.step("load", _echo, params)
    return await ctx.step("charge", _charge, order)
