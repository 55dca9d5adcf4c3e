"""Workflows for the compose tests: transactional steps and child workflows
(IDs prefixed `cmp-`).

Loaded in-process with `load_workflows(["tests.compose.flows"])` and by real
`fencepost worker --workflows tests.compose.flows` processes (the fan-out
crash test). Step functions count their calls in module-level state keyed by
execution ID (in-process only); `reset()` clears it before every test.
Gates (asyncio.Event) let an in-process test hold a delivery at a known point.

The application's own data lives in schema `shop` (see SHOP_DDL), apart from
fencepost's tables, as the README asks of applications.
"""

from __future__ import annotations

import asyncio
import collections
from datetime import UTC, datetime
from typing import Any

import asyncpg
from pydantic import BaseModel, Field

from app.sdk import (
    ChildFailed,
    Retry,
    RetryPolicy,
    StepFailed,
    WorkflowContext,
    workflow,
)

SHOP_DDL = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.orders (
    -- No unique constraint on purpose: a second insert must show up as a
    -- second row, not as an error that hides it.
    order_id     text NOT NULL,
    execution_id text NOT NULL,
    holder       text,
    amount_cents integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
"""

# ------------------------------------------------------------------ test state

CALLS: collections.Counter = collections.Counter()  # (execution_id, what) -> calls
GATES: dict[str, asyncio.Event] = {}


def reset() -> None:
    CALLS.clear()
    GATES.clear()


def bump(execution_id: str, what: str) -> int:
    CALLS[(execution_id, what)] += 1
    return CALLS[(execution_id, what)]


def calls(execution_id: str, what: str) -> int:
    return CALLS[(execution_id, what)]


def gate(name: str) -> asyncio.Event:
    """An asyncio.Event the test opens with `gate(name).set()`."""
    if name not in GATES:
        GATES[name] = asyncio.Event()
    return GATES[name]


# ------------------------------------------------- transactional step functions


async def _insert(conn: asyncpg.Connection, execution_id: str, order_id: str, amount: int,
                  holder: str | None = None) -> None:
    await conn.execute(
        "INSERT INTO shop.orders (order_id, execution_id, holder, amount_cents) "
        "VALUES ($1, $2, $3, $4)",
        order_id, execution_id, holder, amount,
    )


async def insert_order(conn: asyncpg.Connection, execution_id: str, order_id: str,
                       amount: int) -> dict:
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    return {"orderId": order_id, "amountCents": amount}


async def insert_then_fail(conn: asyncpg.Connection, execution_id: str, order_id: str,
                           amount: int) -> dict:
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    raise ValueError(f"card declined for {order_id}")


async def insert_flaky(conn: asyncpg.Connection, execution_id: str, order_id: str,
                       amount: int) -> dict:
    """Inserts, then fails on its first call only."""
    n = bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    if n == 1:
        raise ConnectionResetError("the payment gateway hung up")
    return {"orderId": order_id, "amountCents": amount, "call": n}


async def insert_then_not_json(conn: asyncpg.Connection, execution_id: str, order_id: str,
                               amount: int) -> Any:
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    return {"orderId": order_id, "at": datetime.now(UTC)}  # a datetime is not JSON


async def insert_then_nul(conn: asyncpg.Connection, execution_id: str, order_id: str,
                          amount: int) -> Any:
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    return {"orderId": order_id, "note": "a\u0000b"}  # JSON, but jsonb cannot hold it


async def insert_swallowing_sql_error(conn: asyncpg.Connection, execution_id: str,
                                      order_id: str, amount: int) -> dict:
    """Inserts, then hits a SQL error it catches: the transaction is aborted,
    but the function returns normally."""
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    try:
        await conn.execute("SELECT 1 / 0")
    except asyncpg.DivisionByZeroError:
        pass
    return {"orderId": order_id}


async def insert_slowly(conn: asyncpg.Connection, execution_id: str, order_id: str,
                        amount: int, seconds: float) -> dict:
    bump(execution_id, "insert_order")
    await _insert(conn, execution_id, order_id, amount)
    await asyncio.sleep(seconds)
    return {"orderId": order_id}


TXN_FUNCTIONS = {
    "ok": insert_order,
    "fail": insert_then_fail,
    "flaky": insert_flaky,
    "not-json": insert_then_not_json,
    "nul": insert_then_nul,
    "swallow": insert_swallowing_sql_error,
}


class TxnParams(BaseModel):
    order_id: str
    amount_cents: int = 1999
    mode: str = "ok"
    attempts: int = Field(1, ge=1)


@workflow("cmp-txn", params=TxnParams)
async def txn_flow(ctx: WorkflowContext, p: TxnParams) -> dict:
    fn = TXN_FUNCTIONS[p.mode]
    try:
        order = await ctx.transaction(
            "create-order", fn, ctx.execution_id, p.order_id, p.amount_cents,
            retry=RetryPolicy(max_attempts=p.attempts, initial_interval=0.01),
        )
    except StepFailed as exc:
        return {"failed": {"step": exc.step_key, "name": exc.error_name,
                           "message": exc.error_message}}
    return {"order": order}


@workflow("cmp-txn-replay", params=TxnParams)
async def txn_replay_flow(ctx: WorkflowContext, p: TxnParams) -> dict:
    """The transaction commits in the first delivery, which then ends without
    an acknowledgement (Retry: released); the second delivery replays it."""
    bump(ctx.execution_id, "body")
    order = await ctx.transaction("create-order", insert_order, ctx.execution_id, p.order_id,
                                  p.amount_cents)
    if ctx.attempt == 1:
        raise Retry("lose the first delivery after the transaction committed")
    return {"order": order, "attempt": ctx.attempt}


class SlowTxnParams(BaseModel):
    order_id: str
    seconds: float


@workflow("cmp-txn-slow", params=SlowTxnParams)
async def txn_slow_flow(ctx: WorkflowContext, p: SlowTxnParams) -> dict:
    return await ctx.transaction("create-order", insert_slowly, ctx.execution_id, p.order_id,
                                 1, p.seconds)


async def slow_step(execution_id: str, seconds: float) -> str:
    bump(execution_id, "slow_step")
    await asyncio.sleep(seconds)
    return "done"


@workflow("cmp-slow-step", params=SlowTxnParams)
async def slow_step_flow(ctx: WorkflowContext, p: SlowTxnParams) -> str:
    return await ctx.step("slow", slow_step, ctx.execution_id, p.seconds)


# -------------------------------------------------------------- child workflows


async def wait_gate(execution_id: str) -> str:
    bump(execution_id, "gate:start")
    await asyncio.wait_for(gate(execution_id).wait(), timeout=30)
    bump(execution_id, "gate:end")
    return "opened"


async def double(execution_id: str, value: int) -> int:
    bump(execution_id, "double")
    return value * 2


class ChildParams(BaseModel):
    value: int = 0
    mode: str = "ok"  # ok | fail | gate | gate-fail | sleep


@workflow("cmp-child", params=ChildParams)
async def child_flow(ctx: WorkflowContext, p: ChildParams) -> dict:
    bump(ctx.execution_id, "body")
    if p.mode in ("gate", "gate-fail"):
        await ctx.step("gate", wait_gate, ctx.execution_id)
    if p.mode == "sleep":
        await ctx.sleep("nap", 3600)
    if p.mode in ("fail", "gate-fail"):
        raise LookupError(f"child {p.value} could not find its order")
    doubled = await ctx.step("double", double, ctx.execution_id, p.value)
    return {"value": p.value, "doubled": doubled}


@workflow("cmp-child-timeout", timeout=600)
async def child_with_default_timeout(ctx: WorkflowContext, p: dict) -> str:
    await ctx.sleep("nap", 300)  # ends before the deadline
    return "woke"


class ParentParams(BaseModel):
    children: list[ChildParams] = []
    execution_ids: list[str | None] = []
    child_workflow: str = "cmp-child"
    pause_before_start: bool = False  # a plain await on gate("{id}:before-start")


@workflow("cmp-parent", params=ParentParams)
async def parent_flow(ctx: WorkflowContext, p: ParentParams) -> dict:
    bump(ctx.execution_id, "body")
    if p.pause_before_start:
        await ctx.step("first", double, ctx.execution_id, 1)
        # Workflow code between two steps: no fenced write tells it of a
        # cancellation requested meanwhile.
        await asyncio.wait_for(gate(f"{ctx.execution_id}:before-start").wait(), timeout=30)
    ids = []
    for i, child in enumerate(p.children):
        wanted = p.execution_ids[i] if i < len(p.execution_ids) else None
        try:
            ids.append(await ctx.start_child(f"start-{i}", p.child_workflow, child.model_dump(),
                                             execution_id=wanted))
        except StepFailed as exc:
            return {"startFailed": {"step": exc.step_key, "name": exc.error_name,
                                    "message": exc.error_message}}
    results = []
    for i, child_id in enumerate(ids):
        try:
            results.append({"child": child_id,
                            "result": await ctx.wait_for_child(f"wait-{i}", child_id)})
        except ChildFailed as exc:
            results.append({"child": child_id, "failed": {
                "childId": exc.child_id, "status": exc.child_status, "name": exc.error_name,
                "message": exc.error_message}})
    bump(ctx.execution_id, "return")
    return {"children": results}


# ------------------------------------------------- fan-out under worker crashes
# Run by real worker processes: no in-process state here.


async def pace(i: int) -> int:
    await asyncio.sleep(0.04)
    return i


async def slow_square(i: int, seconds: float) -> int:
    await asyncio.sleep(seconds)
    return i * i


def cube(i: int) -> int:
    return i * i * i


class LeafParams(BaseModel):
    i: int
    seconds: float = 0.3


@workflow("cmp-leaf", params=LeafParams)
async def leaf_flow(ctx: WorkflowContext, p: LeafParams) -> dict:
    square = await ctx.step("square", slow_square, p.i, p.seconds)
    await ctx.sleep("nap", 0.05)
    return {"i": p.i, "square": square, "cube": await ctx.step("cube", cube, p.i)}


class FanoutParams(BaseModel):
    n: int = 50
    seconds: float = 0.3


@workflow("cmp-fanout", params=FanoutParams)
async def fanout_flow(ctx: WorkflowContext, p: FanoutParams) -> dict:
    ids = []
    for i in range(p.n):
        await ctx.step(f"pace-{i}", pace, i)
        ids.append(await ctx.start_child(f"start-{i}", "cmp-leaf", {"i": i, "seconds": p.seconds}))
    results = [await ctx.wait_for_child(f"wait-{i}", cid) for i, cid in enumerate(ids)]
    return {
        "count": len(results),
        "sumSquares": sum(r["square"] for r in results),
        "sumCubes": sum(r["cube"] for r in results),
        "children": [r["i"] for r in results],
    }
