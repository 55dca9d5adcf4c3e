"""Workflows for the redrive and fork tests; every ID starts with `rd-`.
An "outside condition" (FIXED) decides whether the warehouse or the card
answers; calls and the idempotency keys the card saw are counted here."""

from __future__ import annotations

import os

from app.sdk import Cancelled, WorkflowContext, workflow

FIXED: set[str] = set()          # executions whose outside cause has been fixed
CALLS: list[tuple[str, str]] = []  # (execution ID, step)
KEYS: dict[str, list[str]] = {}    # execution ID -> idempotency keys the card saw


def reset() -> None:
    FIXED.clear()
    CALLS.clear()
    KEYS.clear()


def calls(eid: str, step: str) -> int:
    return CALLS.count((eid, step))


class Declined(Exception):
    pass


def reserve(eid: str) -> str:
    CALLS.append((eid, "reserve"))
    return "held"


def charge(eid: str, *, idempotency_key: str) -> dict:
    CALLS.append((eid, "charge"))
    KEYS.setdefault(eid, []).append(idempotency_key)
    if eid not in FIXED and eid.startswith("card-"):
        raise Declined("the card network is down")
    return {"charge": idempotency_key}


def ship(eid: str) -> str:
    CALLS.append((eid, "ship"))
    if eid not in FIXED and eid.startswith("ship-"):
        raise LookupError("the warehouse is down")
    return "shipped"


def release(eid: str) -> str:
    CALLS.append((eid, "release"))
    return "released"


@workflow("rd-order")
async def rd_order(ctx: WorkflowContext, params: dict) -> dict:
    """reserve, charge (an effect), ship. IDs starting `ship-` fail at ship
    and `card-` at charge until FIXED says otherwise."""
    eid = ctx.execution_id
    await ctx.step("reserve", reserve, eid)
    charged = await ctx.effect("charge", charge, eid)
    shipped = await ctx.step("ship", ship, eid)
    return {"charge": charged, "ship": shipped, "note": params.get("note")}


@workflow("rd-approval", cancel_grace=10)
async def rd_approval(ctx: WorkflowContext, params: dict) -> str:
    """reserve, wait for `decision`; a cancel releases the reservation."""
    eid = ctx.execution_id
    await ctx.step("reserve", reserve, eid)
    try:
        decision = await ctx.wait_for_signal("decision")
    except Cancelled:
        await ctx.step("release", release, eid)
        raise
    return f"decided {decision}"


def _fixed_on_disk() -> bool:
    """For worker processes: the outside cause is fixed once this file exists."""
    marks = os.environ.get("ACC_MARK_DIR")
    return marks is not None and os.path.exists(os.path.join(marks, "rd-fixed"))


def work(eid: str) -> str:
    if not _fixed_on_disk():
        raise LookupError("the downstream service is down")
    return "worked"


@workflow("rd-bulk")
async def rd_bulk(ctx: WorkflowContext, params: dict) -> str:
    """One step that fails until a file says the cause is fixed."""
    return await ctx.step("work", work, ctx.execution_id)
