"""The workflow `fencepost soak` runs: three recorded steps that take a little
time and a durable sleep between the first and the second, so that deliveries
are in flight (inside a step, or suspended on the timer) whenever a worker is
killed.

params: {"n": int, "ms": [ms1, ms2, ms3], "sleep": seconds}. The durations are
chosen by the soak client per execution, so replays see the same values.
"""

from __future__ import annotations

import asyncio

from app.sdk import WorkflowContext, workflow

WORKFLOW = "soak-steps"
STEP_KEYS = ("one", "pause", "two", "three")  # every key a completed execution records


async def _work(n: int, ms: float) -> int:
    await asyncio.sleep(ms / 1000)
    return n + 1


@workflow(WORKFLOW)
async def soak_steps(ctx: WorkflowContext, params: dict) -> dict:
    ms = list(params.get("ms") or [20, 20, 20])
    a = await ctx.step("one", _work, params.get("n", 0), ms[0])
    await ctx.sleep("pause", float(params.get("sleep", 0.2)))
    b = await ctx.step("two", _work, a, ms[1])
    c = await ctx.step("three", _work, b, ms[2])
    return {"n": c}
