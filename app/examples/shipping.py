"""`book-shipment`: book a parcel with a carrier whose API allows two calls
at once, one booking per warehouse at a time and ten bookings a second.

Those limits are the `carrier-api` queue's, enforced when executions are
claimed (no worker runs more, however many there are); an operator can
change them at run time (`fencepost queues set carrier-api --concurrency 4`)
or pause the queue while the carrier is down (`fencepost queues pause
carrier-api`). The concurrency key is the params' `warehouse`."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, Field

from app.queues import Queue
from app.sdk import WorkflowContext, workflow

CARRIER_API = Queue("carrier-api", concurrency=2, per_key_concurrency=1, rate_limit=(10, 1.0))


class Shipment(BaseModel):
    order_id: int = Field(gt=0)
    warehouse: str = Field("central", min_length=1, max_length=200)
    weight_grams: int = Field(500, gt=0)


def book_with_carrier(order_id: int, warehouse: str, weight_grams: int, *,
                      idempotency_key: str) -> dict[str, Any]:
    """Stands in for the carrier's booking call (deduplicated by the key)."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
    return {"trackingNumber": f"TRK{digest.upper()}", "orderId": order_id,
            "warehouse": warehouse, "weightGrams": weight_grams}


@workflow("book-shipment", params=Shipment, queue=CARRIER_API, concurrency_key="warehouse")
async def book_shipment(ctx: WorkflowContext, p: Shipment) -> dict[str, Any]:
    # The carrier deduplicates by the idempotency key: a booking in doubt
    # (a crash after calling out) may safely be made again.
    booking: dict[str, Any] = await ctx.effect("book-with-carrier", book_with_carrier, p.order_id,
                                               p.warehouse, p.weight_grams, idempotent=True)
    return booking
