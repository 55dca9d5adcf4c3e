"""`approve-refund`: waits for a person to approve or reject a refund by
POSTing the `approval` signal."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.sdk import SignalTimeout, WorkflowContext, workflow


class RefundRequest(BaseModel):
    order_id: int = Field(gt=0)
    amount_cents: int = Field(gt=0)
    approval_timeout_seconds: float = Field(3600, gt=0)


def issue_refund(order_id: int, amount_cents: int) -> dict:
    return {"refundId": f"re_{order_id}", "amountCents": amount_cents}


@workflow("approve-refund", params=RefundRequest)
async def approve_refund(ctx: WorkflowContext, p: RefundRequest) -> dict:
    try:
        decision = await ctx.wait_for_signal("approval", timeout=p.approval_timeout_seconds)
    except SignalTimeout:
        return {"refunded": False, "reason": "no decision in time"}
    if not isinstance(decision, dict) or not decision.get("approved"):
        return {"refunded": False, "reason": "rejected"}
    refund = await ctx.step("issue-refund", issue_refund, p.order_id, p.amount_cents)
    return {"refunded": True, "refund": refund, "approvedBy": decision.get("by")}
