"""A workflow for the schedule-version tests (`ver-sched-report`), fired by a
schedule created through the store. Tests give each worker's code its own
version of it (`dataclasses.replace(definition, version=...)`)."""

from __future__ import annotations

from typing import Any

from app.sdk import WorkflowContext, workflow


@workflow("ver-sched-report", version="1")
async def report(ctx: WorkflowContext, params: Any) -> dict:
    return {"scheduledAt": ctx.context.get("scheduledAt")}
