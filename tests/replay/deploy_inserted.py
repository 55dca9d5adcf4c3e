"""rp-order as a deploy changes it (inserted), for a `fencepost replay`
subprocess (never imported by the test process: flows.py holds rp-order there)."""

from typing import Any

from app.sdk import WorkflowContext, workflow
from tests.replay import steps, variants

steps.ARMED["mode"] = "process"


@workflow("rp-order")
async def order(ctx: WorkflowContext, params: dict) -> Any:
    return await variants.inserted(ctx, params)
