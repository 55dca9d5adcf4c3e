"""Workflows at the edges of divergence detection: cleanup after a cancel
(noticed at a step's write, at a sleep, at a signal wait with a timeout),
code that raises before a recorded step, code that wraps the divergence.
`CODE["now"]` switches code between deliveries; `CALLS` counts step calls."""

from __future__ import annotations

import collections
from typing import Any

from app.sdk import Cancelled, Nondeterminism, WorkflowContext, workflow

STORE: dict[str, Any] = {}
CALLS: collections.Counter = collections.Counter()


def fa() -> str:
    return "a"


async def b_requests_cancel(eid: str) -> str:
    # A cancel request arrives while step b runs: b's write answers "cancel".
    await STORE["store"].operator.request_cancel(eid, "alice")
    return "b"


def fe() -> str:
    CALLS["e"] += 1
    return "e"


def fd() -> str:
    CALLS["d"] += 1
    return "d"


async def flaky() -> str:
    # The first cleanup delivery does not finish: its worker stops meanwhile.
    CALLS["f"] += 1
    if CALLS["f"] == 1:
        import asyncio
        await asyncio.sleep(3600)
    return "f"


@workflow("edge-cancel", cancel_grace=30)
async def cancel_flow(ctx: WorkflowContext, p: Any) -> str:
    await ctx.step("a", fa)
    try:
        await ctx.step("b", b_requests_cancel, ctx.execution_id)
        await ctx.step("e", fe)
    except Cancelled:
        await ctx.step("d", fd)
        await ctx.step("f", flaky)
        raise
    return "done"


CODE: dict[str, str] = {"now": "v1"}


def reset() -> None:
    CALLS.clear()
    CODE["now"] = "v1"


class Invalid(Exception):
    pass


def fx() -> str:
    CALLS["x"] += 1
    return "x"


@workflow("edge-raise")
async def raise_flow(ctx: WorkflowContext, p: Any) -> str:
    await ctx.step("a", fa)
    await ctx.sleep("nap", 3600)
    if CODE["now"] == "v2":
        # The new code raises here: the recorded step `x` is no longer reached.
        raise Invalid("new validation")
    await ctx.step("x", fx)
    await ctx.sleep("nap2", 3600)
    return "done"


def release() -> str:
    CALLS["release"] += 1
    return "released"


@workflow("edge-approval", cancel_grace=30)
async def approval_flow(ctx: WorkflowContext, p: Any) -> str:
    await ctx.step("reserve", fa)
    try:
        await ctx.wait_for_signal("decision", timeout=3600)
    except Cancelled:
        await ctx.step("release", release)
        raise
    return "shipped"


@workflow("edge-nap", cancel_grace=30)
async def nap_flow(ctx: WorkflowContext, p: Any) -> str:
    await ctx.step("a", fa)
    try:
        await ctx.sleep("nap", 3600)
        await ctx.step("e", fe)
    except Cancelled:
        await ctx.step("d", fd)
        raise
    return "done"


@workflow("edge-wrap")
async def wrap_flow(ctx: WorkflowContext, p: Any) -> str:
    try:
        await ctx.step("a", fa)
        await ctx.sleep("nap", 3600)
        if CODE["now"] == "v2":
            await ctx.step("inserted", fx)     # a step inserted before recorded `x`
        await ctx.step("x", fx)
        await ctx.sleep("nap2", 3600)
    except Nondeterminism as exc:  # an author's wrapper: re-raised as a domain error
        raise RuntimeError("order step failed") from exc
    return "done"
