"""Workflows the client tests run on real workers."""

from __future__ import annotations

from typing import Any

from app.sdk import WorkflowContext, workflow


def _echo(value: Any) -> Any:
    return value


def _boom(message: str) -> None:
    raise ValueError(message)


@workflow("client-echo")
async def echo(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.step("echo", _echo, params)


@workflow("client-boom")
async def boom(ctx: WorkflowContext, params: Any) -> Any:
    await ctx.step("boom", _boom, "the order was refused")


@workflow("client-approval")
async def approval(ctx: WorkflowContext, params: Any) -> Any:
    decision = await ctx.wait_for_signal("approve")
    return {"approved": decision}


# The "bug" a redrive runs again after the fix: tests switch it off.
FLAKY = {"broken": True}


def _charge(order: Any) -> dict:
    if FLAKY["broken"]:
        raise RuntimeError("the payment provider is down")
    return {"charged": order}


@workflow("client-flaky")
async def flaky(ctx: WorkflowContext, params: Any) -> Any:
    order = await ctx.step("load", _echo, params)
    return await ctx.step("charge", _charge, order)
