"""Workflows for the operator tests (issue 4). Every workflow ID starts with `op-`.

Two kinds of runners import this module:

* in-process `Worker(...)` tasks in the test's event loop: their step
  functions meet the test through GATES / STARTED / CALLS below (asyncio
  objects shared with the test, since everything runs in one loop);
* real `fencepost worker` processes (`--workflows tests.operator.flows`):
  their effect functions talk to a *fake remote* kept in side tables of the
  test's own database (DATABASE_URL), created by `REMOTE_DDL`:

    op_remote_charges(idempotency_key PK, charge_id, amount, calls)
        the remote's record: a charge is stored once per key; every further
        call with that key is deduplicated (calls + 1, same charge returned)
    op_remote_calls(call_id, execution_id, idempotency_key, kind, pid, at)
        every request the remote received (kind 'charge' or 'reconcile'; 'hanging'
        once a call hanging until SIGCONT is ready for it),
        written (committed) before the remote does anything else, so a row
        tells the test "the attempt was persisted and the call was made"
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import defaultdict
from datetime import timedelta

import asyncpg

from app.db import asyncpg_dsn
from app.sdk import (
    NOT_FOUND,
    Cancelled,
    DeadlineExceeded,
    Retry,
    RetryPolicy,
    StepFailed,
    WorkflowContext,
    workflow,
)

REMOTE_DDL = """
CREATE TABLE op_remote_charges (
    idempotency_key text PRIMARY KEY,
    charge_id text NOT NULL,
    amount int NOT NULL,
    calls int NOT NULL DEFAULT 1
);
CREATE TABLE op_remote_calls (
    call_id bigserial PRIMARY KEY,
    execution_id text NOT NULL,
    idempotency_key text NOT NULL,
    kind text NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

# ------------------------------------------------------------- in-process state

GATES: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
STARTED: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
CALLS: list[tuple[str, str]] = []  # (execution_id, step) per step-function call


def reset() -> None:
    GATES.clear()
    STARTED.clear()
    CALLS.clear()


async def record_call(eid: str, step: str) -> str:
    CALLS.append((eid, step))
    return step


async def gated(eid: str, step: str) -> str:
    """Block until the test opens GATES[eid]."""
    CALLS.append((eid, step))
    STARTED[eid].set()
    await GATES[eid].wait()
    return step


# ----------------------------------------------------------------- fake remote


async def _remote() -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(os.environ["DATABASE_URL"]))


async def _hang_until_killed() -> None:
    await asyncio.sleep(3600)


async def _hang_until_resumed(conn: asyncpg.Connection, eid: str, idempotency_key: str) -> None:
    """Return once the process has been continued (SIGCONT), at most 60 s. The
    'hanging' row is written only once the handler is in place: a SIGCONT
    sent before it would be lost and the call would hang the whole 60 s."""
    loop = asyncio.get_running_loop()
    resumed = asyncio.Event()
    loop.add_signal_handler(signal.SIGCONT, resumed.set)
    try:
        await conn.execute(
            "INSERT INTO op_remote_calls (execution_id, idempotency_key, kind, pid) "
            "VALUES ($1, $2, 'hanging', $3)", eid, idempotency_key, os.getpid())
        await asyncio.wait_for(resumed.wait(), 60)
    finally:
        loop.remove_signal_handler(signal.SIGCONT)


async def remote_charge(eid: str, amount: int, hang: str = "none", *,
                        idempotency_key: str) -> dict:
    """The remote call. `hang` applies to the first request with this key only:
    `before_charge` (the request arrived, nothing charged yet, then the caller
    hangs), `after_charge` (charged, the answer never gets back), or
    `until_resumed` (charged, answer returned once the process was continued;
    `until_resumed_slow`: 0.5 s after that)."""
    conn = await _remote()
    try:
        earlier = await conn.fetchval(
            "SELECT count(*) FROM op_remote_calls WHERE idempotency_key = $1 AND kind = 'charge'",
            idempotency_key)
        await conn.execute(
            "INSERT INTO op_remote_calls (execution_id, idempotency_key, kind, pid) "
            "VALUES ($1, $2, 'charge', $3)", eid, idempotency_key, os.getpid())
        first = earlier == 0
        if first and hang == "before_charge":
            await _hang_until_killed()
        row = await conn.fetchrow(
            """
            INSERT INTO op_remote_charges (idempotency_key, charge_id, amount)
            VALUES ($1, 'ch_' || md5($1), $2)
            ON CONFLICT (idempotency_key)
            DO UPDATE SET calls = op_remote_charges.calls + 1
            RETURNING charge_id, amount, calls
            """, idempotency_key, amount)
        if first and hang == "after_charge":
            await _hang_until_killed()
        if first and hang in ("until_resumed", "until_resumed_slow"):
            await _hang_until_resumed(conn, eid, idempotency_key)
            if hang == "until_resumed_slow":  # the answer needs a moment more
                await asyncio.sleep(0.5)
    finally:
        await conn.close()
    return {"chargeId": row["charge_id"], "amount": row["amount"], "pid": os.getpid(),
            "deduplicated": row["calls"] > 1}


async def remote_lookup(idempotency_key: str):
    """reconcile: ask the remote whether it has the charge."""
    conn = await _remote()
    try:
        eid = idempotency_key.rsplit(":", 1)[0]
        await conn.execute(
            "INSERT INTO op_remote_calls (execution_id, idempotency_key, kind, pid) "
            "VALUES ($1, $2, 'reconcile', $3)", eid, idempotency_key, os.getpid())
        row = await conn.fetchrow(
            "SELECT charge_id, amount FROM op_remote_charges WHERE idempotency_key = $1",
            idempotency_key)
    finally:
        await conn.close()
    if row is None:
        return NOT_FOUND
    return {"chargeId": row["charge_id"], "amount": row["amount"], "reconciled": True}


def _noop() -> str:
    return "ok"


@workflow("op-charge")
async def op_charge(ctx: WorkflowContext, p: dict) -> dict:
    """params: {"recovery": "idempotent" | "reconcile" | "neither", "hang": see
    remote_charge, "amount": int}. A failed charge (an operator's `fail`) is
    caught and returned, so the outcome shows the workflow saw StepFailed."""
    opts: dict = {}
    if p["recovery"] == "idempotent":
        opts["idempotent"] = True
    elif p["recovery"] == "reconcile":
        opts["reconcile"] = remote_lookup
    try:
        receipt = await ctx.effect("charge", remote_charge, ctx.execution_id,
                                   int(p.get("amount", 100)), p.get("hang", "none"), **opts)
    except StepFailed as exc:
        receipt = {"stepFailed": exc.step_key, "name": exc.error_name,
                   "message": exc.error_message}
    after = await ctx.step("after", _noop)
    return {"receipt": receipt, "after": after}


@workflow("op-crash")
async def op_crash(ctx: WorkflowContext, p: dict) -> dict:
    """Kills its worker process in a step, every delivery."""
    await ctx.step("crash", os._exit, 1)
    return {"unreachable": True}


# ------------------------------------------------------------ in-process flows


@workflow("op-gated")
async def op_gated(ctx: WorkflowContext, p: dict) -> dict:
    """slow (blocks until the test opens the gate), then after. Cleanup runs
    in `except Cancelled` / `except DeadlineExceeded` and in `finally`, as
    recorded steps."""
    eid = ctx.execution_id
    try:
        slow = await ctx.step("slow", gated, eid, "slow")
        after = await ctx.step("after", record_call, eid, "after")
        return {"slow": slow, "after": after}
    except Cancelled:
        await ctx.step("cleanup", record_call, eid, "cleanup")
        raise
    except DeadlineExceeded:
        await ctx.step("cleanup-deadline", record_call, eid, "cleanup-deadline")
        raise
    finally:
        await ctx.step("finally", record_call, eid, "finally")


@workflow("op-quick")
async def op_quick(ctx: WorkflowContext, p: dict) -> dict:
    """One gated step, then return: for racing a cancel against the acknowledgement."""
    one = await ctx.step("one", gated, ctx.execution_id, "one")
    return {"one": one}


async def local_effect(eid: str, *, idempotency_key: str) -> str:
    CALLS.append((eid, "effect"))
    return f"charged {idempotency_key}"


@workflow("op-effect-after-gate")
async def op_effect_after_gate(ctx: WorkflowContext, p: dict) -> dict:
    """Workflow code (not a step) waits on the gate, then an effect."""
    await gated(ctx.execution_id, "gate")
    charged = await ctx.effect("charge", local_effect, ctx.execution_id)
    return {"charged": charged}


@workflow("op-sleep")
async def op_sleep(ctx: WorkflowContext, p: dict) -> dict:
    await ctx.sleep("nap", float(p.get("seconds", 3600)))
    after = await ctx.step("after", record_call, ctx.execution_id, "after")
    return {"after": after}


class Declined(Exception):
    pass


async def always_fails(eid: str) -> None:
    CALLS.append((eid, "flaky"))
    raise Declined("the remote said no")


@workflow("op-retry-long")
async def op_retry_long(ctx: WorkflowContext, p: dict) -> dict:
    """A step whose next retry would start 30 s later."""
    policy = RetryPolicy(max_attempts=5, initial_interval=30.0, backoff=1.0)
    await ctx.step("flaky", always_fails, ctx.execution_id, retry=policy)
    return {"unreachable": True}


@workflow("op-poison")
async def op_poison(ctx: WorkflowContext, p: dict) -> dict:
    """Ends every delivery without an acknowledgement (as a crash would)."""
    CALLS.append((ctx.execution_id, f"delivery-{ctx.attempt}"))
    raise Retry("not today")


@workflow("op-default-timeout", timeout=timedelta(minutes=5))
async def op_default_timeout(ctx: WorkflowContext, p: dict) -> dict:
    return {}
