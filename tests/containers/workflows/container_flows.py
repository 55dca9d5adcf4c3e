"""A team's own module, as the README's deployment section says to add one: mounted
with deploy/workflows' modules (WORKFLOWS_DIR) and named in
FENCEPOST_WORKFLOWS. Its steps take a while, so the container tests can kill and stop
workers while deliveries are running."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow


class Steps(BaseModel):
    n: int = Field(ge=0)
    steps: int = Field(3, ge=1, le=20)
    step_seconds: float = Field(0.5, ge=0, le=10)


async def add_one(n: int, seconds: float) -> int:
    await asyncio.sleep(seconds)
    return n + 1


@workflow("container-steps", params=Steps)
async def container_steps(ctx: WorkflowContext, p: Steps) -> dict:
    n = p.n
    for i in range(p.steps):
        n = await ctx.step(f"step-{i}", add_one, n, p.step_seconds)
    return {"n": n}
