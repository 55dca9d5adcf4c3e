"""Workflows for tests/http/test_concurrent_callers.py (run by real worker
processes)."""

from __future__ import annotations

from app.sdk import WorkflowContext, workflow


@workflow("concurrent-signals")
async def concurrent_signals(ctx: WorkflowContext, params) -> list:
    """Consume `n` signals named `go`, each under its own step key, and
    return their payloads in the order they were consumed."""
    got = []
    for i in range(int(params["n"])):
        got.append(await ctx.wait_for_signal("go", key=f"go-{i}"))
    return got
