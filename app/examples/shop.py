"""The shop's `charge-order`: wait out a cancel window, load the order, charge
the card through a fake payment provider, return a receipt."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow


class ChargeOrder(BaseModel):
    order_id: int = Field(gt=0)
    amount_cents: int = Field(1999, gt=0)
    cancel_window_seconds: float = Field(2.0, ge=0, le=86400)


def load_order(order_id: int) -> dict[str, Any]:
    """Stands in for a read from the shop's own database."""
    return {"orderId": order_id, "status": "open"}


class FakePaymentProvider:
    """Deduplicates by idempotency key, as a real provider (Stripe, Adyen) does."""

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, Any]] = {}

    def charge(self, order: dict[str, Any], amount_cents: int, idempotency_key: str) -> dict[str, Any]:
        if idempotency_key not in self.charges:
            digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]
            self.charges[idempotency_key] = {
                "chargeId": f"ch_{digest}",
                "orderId": order["orderId"],
                "amountCents": amount_cents,
            }
        return self.charges[idempotency_key]


payments = FakePaymentProvider()


@workflow("charge-order", params=ChargeOrder)
async def charge_order(ctx: WorkflowContext, p: ChargeOrder) -> dict[str, Any]:
    await ctx.sleep("cancel-window", timedelta(seconds=p.cancel_window_seconds))
    order = await ctx.step("load-order", load_order, p.order_id)
    if order["status"] != "open":
        return {"charged": False}
    # The provider deduplicates by idempotency key, so a charge whose outcome
    # is in doubt (a crash after calling out) may safely be made again.
    receipt = await ctx.effect(
        "charge-card",
        payments.charge,
        order,
        p.amount_cents,
        idempotency_key=f"{ctx.execution_id}:charge-card",
        idempotent=True,
    )
    return {"charged": True, "receipt": receipt}
