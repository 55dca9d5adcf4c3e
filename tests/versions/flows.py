"""Workflows for the version-move tests; every ID starts with `vm-`.

`vm-order` as deployed at version "1" (reserve, wait for `go`, ship), and
the code of later deploys, as definitions a test hands to the API process
and to workers (one registry entry, several codes):
  V2: fits version 1's histories (a step appended after ship);
  V3: does not (a step inserted before reserve).
Step functions count their calls here."""

from __future__ import annotations

from dataclasses import replace

from app.registry import WorkflowDefinition, load_workflows
from app.sdk import WorkflowContext, workflow

CALLS: list[tuple[str, str]] = []  # (execution ID, step)


def reset() -> None:
    CALLS.clear()


def called(eid: str, step: str) -> str:
    CALLS.append((eid, step))
    return step


@workflow("vm-order", version="1")
async def order_v1(ctx: WorkflowContext, params: dict) -> str:
    await ctx.step("reserve", called, ctx.execution_id, "reserve")
    await ctx.wait_for_signal("go")
    await ctx.step("ship", called, ctx.execution_id, "ship")
    return "done-v1"


async def order_v2(ctx: WorkflowContext, params: dict) -> str:
    """Fits version 1: the same asks in the same order, then one more."""
    await ctx.step("reserve", called, ctx.execution_id, "reserve")
    await ctx.wait_for_signal("go")
    await ctx.step("ship", called, ctx.execution_id, "ship")
    await ctx.step("notify", called, ctx.execution_id, "notify")
    return "done-v2"


async def order_v3(ctx: WorkflowContext, params: dict) -> str:
    """Does not fit version 1: a step inserted before reserve."""
    await ctx.step("check", called, ctx.execution_id, "check")
    await ctx.step("reserve", called, ctx.execution_id, "reserve")
    await ctx.wait_for_signal("go")
    await ctx.step("ship", called, ctx.execution_id, "ship")
    return "done-v3"


V1: dict[str, WorkflowDefinition] = load_workflows(["tests.versions.flows"])


def deploy(version: str, fn=None) -> dict[str, WorkflowDefinition]:
    """The workflows as a deploy of `version` carries them: `fn` as
    vm-order's code (default: that version's)."""
    code = fn or {"1": order_v1, "2": order_v2, "3": order_v3}[version]
    return {**V1, "vm-order": replace(V1["vm-order"], fn=code, version=version)}


V2 = deploy("2")
V3 = deploy("3")
