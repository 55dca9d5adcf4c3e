"""Workflows for the schedule tests: two declare schedules in code, one is
the target of schedules created over HTTP or through the store."""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Report(BaseModel):
    day: str | None = None  # every field has a default: scheduled with params {}


@workflow("sched-test-minutely", schedule="* * * * *")
async def minutely(ctx: WorkflowContext, params) -> dict:
    return {"context": dict(ctx.context), "params": params}


@workflow("sched-test-nightly", params=Report, schedule="30 2 * * *", timezone="Europe/Warsaw")
async def nightly(ctx: WorkflowContext, p: Report) -> dict:
    return {"day": p.day}


@workflow("sched-test-plain")
async def plain(ctx: WorkflowContext, params) -> dict:
    return {"params": params, "scheduledAt": ctx.context.get("scheduledAt")}
