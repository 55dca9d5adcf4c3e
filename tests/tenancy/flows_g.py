"""Workflows for engineer G's tenancy tests (derived IDs, signal senders)."""

from __future__ import annotations

from app.sdk import WorkflowContext, workflow


@workflow("g-parent")
async def g_parent(ctx: WorkflowContext, params) -> dict:
    # The default child ID: derived by fencepost from (parent, key).
    child_id = await ctx.start_child("kid0", "g-kid", {})
    result = await ctx.wait_for_child("kid0-result", child_id)
    return {"child": child_id, "result": result}


@workflow("g-kid")
async def g_kid(ctx: WorkflowContext, params) -> str:
    return "kid-done"


@workflow("g-plain")
async def g_plain(ctx: WorkflowContext, params) -> int:
    return 1


def _sender(s) -> list | None:
    return None if s.sender is None else [s.sender.token_id, s.sender.name, s.sender.role]


@workflow("g-who", signals={"restricted": "operate"})
async def g_who(ctx: WorkflowContext, params) -> dict:
    # The first wait is replayed from its record by the delivery that
    # completes: what it returns then is what was recorded.
    first = await ctx.wait_for_signal("go", with_sender=True)
    plain = await ctx.wait_for_signal("next")
    return {"payload": first.payload, "sender": _sender(first), "next": plain}
