"""Workflows for the child-version tests (IDs prefixed `ver-cmp-`): a parent
that starts a child, may hold its delivery at a gate, then waits for the
child. Loaded in-process; a test builds each worker's registry from these
definitions with the versions that worker's code carries
(`dataclasses.replace(definition, version=...)`)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.sdk import WorkflowContext, workflow

GATES: dict[str, asyncio.Event] = {}


def reset() -> None:
    GATES.clear()


def gate(name: str) -> asyncio.Event:
    if name not in GATES:
        GATES[name] = asyncio.Event()
    return GATES[name]


async def hold(execution_id: str, held: bool) -> str:
    """With `held`, waits until the test opens gate `execution_id`."""
    if held:
        await gate(execution_id).wait()
    return "held" if held else "passed"


@workflow("ver-cmp-parent", version="1")
async def parent(ctx: WorkflowContext, p: dict) -> dict:
    """params: {"child": workflow ID (default ver-cmp-child), "hold": bool}."""
    child = await ctx.start_child("child", p.get("child", "ver-cmp-child"), {"from": "parent"})
    await ctx.step("hold", hold, ctx.execution_id, bool(p.get("hold")))
    return {"child": child, "result": await ctx.wait_for_child("wait", child)}


@workflow("ver-cmp-child", version="1")
async def child(ctx: WorkflowContext, p: Any) -> dict:
    return {"child": ctx.execution_id}


@workflow("ver-cmp-elsewhere")
async def elsewhere(ctx: WorkflowContext, p: Any) -> dict:
    """A child the parent's worker does not carry."""
    return {"elsewhere": ctx.execution_id}
