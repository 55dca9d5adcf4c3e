"""Workflows registered for the HTTP tests' `registry_client`.

Only admission looks at them (the API validates params against the model);
no worker runs them here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.sdk import WorkflowContext, workflow


class ChargeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(min_length=1)
    amount_cents: int = Field(gt=0)


@workflow("http-test-charge", params=ChargeParams)
async def http_test_charge(ctx: WorkflowContext, p: ChargeParams) -> dict:
    return {"charged": p.amount_cents}


@workflow("http-test-any")
async def http_test_any(ctx: WorkflowContext, params) -> dict:
    return {"params": params}
