"""Workflows for the dashboard's browser tests. Every workflow ID starts with `ui-`."""

from __future__ import annotations

from typing import Any

from app.sdk import NO_RETRY, OutcomeUnknown, WorkflowContext, workflow

FIXED: set[str] = set()            # ui-ship executions whose warehouse is back
CALLS: list[tuple[str, str]] = []  # (execution ID, step) each time a step function ran


def charge_card(amount: int, *, idempotency_key: str) -> dict:
    # The card network never says: the attempt is in doubt, so the execution parks.
    raise OutcomeUnknown(f"the card network timed out ({idempotency_key})")


def make_receipt(charge: Any) -> dict:
    return {"receipt": f"rcpt-{charge.get('chargeId') if isinstance(charge, dict) else charge}"}


def echo(value: Any) -> Any:
    return value


@workflow("ui-charge")
async def ui_charge(ctx: WorkflowContext, params: Any) -> dict:
    charge = await ctx.effect("charge", charge_card, params.get("amount", 100))
    receipt = await ctx.step("receipt", make_receipt, charge)
    return {"charge": charge, **receipt}


@workflow("ui-sleep")
async def ui_sleep(ctx: WorkflowContext, params: Any) -> dict:
    await ctx.sleep("nap", 3600)
    return {"woke": True}


@workflow("ui-echo")
async def ui_echo(ctx: WorkflowContext, params: Any) -> dict:
    return {"echo": await ctx.step("echo", echo, params)}


def reserve(eid: str) -> str:
    CALLS.append((eid, "reserve"))
    return "held"


def ship(eid: str, note: Any) -> str:
    CALLS.append((eid, "ship"))
    if eid not in FIXED:
        raise LookupError("the warehouse is down")
    return f"shipped {note}"


@workflow("ui-ship")
async def ui_ship(ctx: WorkflowContext, params: Any) -> dict:
    """reserve, then ship: ship fails (no retry) until FIXED holds the execution."""
    eid = ctx.execution_id
    await ctx.step("reserve", reserve, eid)
    shipped = await ctx.step("ship", ship, eid, params.get("note"), retry=NO_RETRY)
    return {"ship": shipped}
