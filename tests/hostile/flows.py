"""Workflows for the hostile tests: `hostile-refund` gives admission a params
model (422 INVALID_PARAMS) and a registry (404 WORKFLOW_NOT_FOUND); no worker
runs it; nor `hostile-keyed`, whose concurrency key (params' `customer`)
cannot be a list (422 INVALID_CONCURRENCY_KEY). `hostile-outage` is run by an in-process worker across a Postgres
outage. `hostile-versioned` is version "2" of code whose version "1" asked
for `reserve` first: the replay check refuses to move a version 1 history
to it (409 REPLAY_DIVERGES)."""

from __future__ import annotations

import asyncio
import collections

from pydantic import BaseModel, ConfigDict, Field

from app.queues import Queue
from app.sdk import WorkflowContext, workflow


class RefundParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)


@workflow("hostile-refund", params=RefundParams)
async def hostile_refund(ctx: WorkflowContext, p: RefundParams) -> dict:
    return {"refunded": p.amount_cents}


@workflow("hostile-keyed", queue=Queue("hostile-queue", concurrency=5),
          concurrency_key="customer")
async def hostile_keyed(ctx: WorkflowContext, params) -> None:
    return None


# The in-process worker outage test (test_worker_outage.py): the first step
# waits on a gate the test opens; the calls of each step are counted.
GATES: dict[str, asyncio.Event] = {}
CALLS: collections.Counter = collections.Counter()


async def _gated(execution_id: str) -> str:
    CALLS[(execution_id, "gated")] += 1
    gate = GATES.setdefault(execution_id, asyncio.Event())
    await asyncio.wait_for(gate.wait(), timeout=60)
    return "gated"


async def _plain(execution_id: str) -> str:
    CALLS[(execution_id, "plain")] += 1
    return "plain"


@workflow("hostile-outage")
async def hostile_outage(ctx: WorkflowContext, params: dict) -> dict:
    first = await ctx.step("first", _gated if params.get("gated") else _plain, ctx.execution_id)
    second = await ctx.step("second", _plain, ctx.execution_id)
    return {"first": first, "second": second}


@workflow("hostile-versioned", version="2")
async def hostile_versioned(ctx: WorkflowContext, params: dict) -> None:
    # A step inserted before the first one version "1" asked for.
    await ctx.step("check", _plain, ctx.execution_id)
    await ctx.step("reserve", _plain, ctx.execution_id)
