"""`approve-refund`: waits for an operator to approve or reject a refund by
POSTing the `approval` signal.

Only an `operate` token (or an operator through the dashboard) may send
`approval`: the service that requested the refund (its trigger token
admitted the execution) cannot approve it itself (403). Who approved is
the signal's recorded sender, not anything the payload says."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.sdk import SignalTimeout, WorkflowContext, workflow


class RefundRequest(BaseModel):
    order_id: int = Field(gt=0)
    amount_cents: int = Field(gt=0)
    approval_timeout_seconds: float = Field(3600, gt=0)


def issue_refund(order_id: int, amount_cents: int) -> dict[str, Any]:
    return {"refundId": f"re_{order_id}", "amountCents": amount_cents}


@workflow("approve-refund", params=RefundRequest, signals={"approval": "operate"})
async def approve_refund(ctx: WorkflowContext, p: RefundRequest) -> dict[str, Any]:
    try:
        decision = await ctx.wait_for_signal("approval", timeout=p.approval_timeout_seconds,
                                             with_sender=True)
    except SignalTimeout:
        return {"refunded": False, "reason": "no decision in time"}
    sender = decision.sender
    by = None if sender is None else {"tokenId": sender.token_id, "name": sender.name,
                                      "role": sender.role}
    # The API refuses others (signals= above); checked here too, for an API
    # started without this module loaded.
    if sender is None or sender.role != "operate":
        return {"refunded": False, "reason": "the approval did not come from an operator",
                "sentBy": by}
    if not isinstance(decision.payload, dict) or not decision.payload.get("approved"):
        return {"refunded": False, "reason": "rejected", "rejectedBy": by}
    refund = await ctx.step("issue-refund", issue_refund, p.order_id, p.amount_cents)
    return {"refunded": True, "refund": refund, "approvedBy": by}
