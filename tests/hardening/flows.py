"""Workflows that misbehave on purpose: steps that never return, code that
runs steps in `finally:`, effects that raise transport errors, results too
large to store. Used by real `fencepost worker` processes
(`--workflows tests.hardening.flows`) and by in-process workers; every
workflow ID starts with `hard-`. Step functions leave evidence with
tests.worker_processes.flows.mark (files, so they survive a process)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from app.sdk import RetryPolicy, WorkflowContext, workflow
from tests.worker_processes.flows import mark, run_step

# In-process tests count calls here (a worker process counts in files).
CALLS: dict[str, int] = {}
# Sync step functions blocked on these are released at teardown.
RELEASE = threading.Event()


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def reset() -> None:
    CALLS.clear()
    RELEASE.clear()


# ------------------------------------------------------------- hung steps


def hang_sync(eid: str, seconds: float) -> str:
    """A sync step that does not return for `seconds` (its thread cannot be killed)."""
    mark("start", eid, "hang")
    _count("hang_sync")
    RELEASE.wait(seconds)
    return "woke"


async def hang_async(eid: str, seconds: float) -> str:
    mark("start", eid, "hang")
    _count("hang_async")
    await asyncio.sleep(seconds)
    return "woke"


@workflow("hard-hang")
async def hard_hang(ctx: WorkflowContext, params: dict) -> str:
    """params: {"mode": "sync" | "async", "seconds": float}: one step that hangs."""
    fn = hang_sync if params.get("mode", "sync") == "sync" else hang_async
    return await ctx.step("hang", fn, ctx.execution_id, float(params.get("seconds", 3600)))


@workflow("hard-step-timeout", step_timeout=0.3)
async def hard_step_timeout(ctx: WorkflowContext, params: dict) -> dict:
    """The workflow's default step timeout (0.3 s) bounds each attempt;
    params: {"mode": "sync" | "async", "attempts": int, "timeout": float?}."""
    fn = hang_sync if params.get("mode") == "sync" else hang_async
    policy = RetryPolicy(max_attempts=int(params.get("attempts", 1)), initial_interval=0.01)
    kwargs = {"timeout": params["timeout"]} if "timeout" in params else {}
    try:
        await ctx.step("slow", fn, ctx.execution_id, 30.0, retry=policy, **kwargs)
    except Exception as exc:  # StepFailed, naming StepTimeout
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


_quick_calls: dict[str, int] = {}


async def slow_then_quick(eid: str) -> str:
    """Hangs on its first call, answers at once afterwards."""
    _count("slow_then_quick")
    n = _quick_calls[eid] = _quick_calls.get(eid, 0) + 1
    if n == 1:
        await asyncio.sleep(30)
    return f"call {n}"


@workflow("hard-timeout-then-ok", step_timeout=0.3)
async def hard_timeout_then_ok(ctx: WorkflowContext, params: dict) -> str:
    return await ctx.step("flaky", slow_then_quick, ctx.execution_id,
                          retry=RetryPolicy(max_attempts=3, initial_interval=0.01))


# ------------------------------------------------------ retries vs deadline


def always_fails() -> None:
    _count("always_fails")
    raise RuntimeError("the downstream is down")


@workflow("hard-retry-past-deadline")
async def hard_retry_past_deadline(ctx: WorkflowContext, params: dict) -> None:
    await ctx.step("doomed", always_fails,
                   retry=RetryPolicy(max_attempts=10, initial_interval=2, backoff=1))


# ------------------------------------------------------- cleanup in finally


@workflow("hard-finally")
async def hard_finally(ctx: WorkflowContext, params: dict) -> dict:
    """A step whose first call blocks until the process is paused and
    continued, and a cleanup step in `finally:`; both leave marks."""
    try:
        charged = await ctx.step("charge", run_step, ctx.execution_id, "charge", 0.0,
                                 float(params.get("block_first", 30)), "until_resumed",
                                 float(params.get("after_resume", 0.0)))
    finally:
        await ctx.step("cleanup", run_step, ctx.execution_id, "cleanup")
    return {"charged": charged}


# ------------------------------------------------------------------ effects


def transport_error(kind: str):
    def call(idempotency_key: str) -> None:
        _count(f"transport:{kind}")
        if kind == "connection":
            raise ConnectionResetError("connection reset by peer")
        if kind == "timeout":
            raise TimeoutError("read timed out")
        if kind == "oserror":
            raise OSError("network is unreachable")
        raise ValueError("card declined")  # the remote side answered: a known failure
    call.__qualname__ = f"transport_error.{kind}"
    return call


@workflow("hard-effect-transport")
async def hard_effect_transport(ctx: WorkflowContext, params: dict) -> str:
    """params: {"kind": "connection" | "timeout" | "oserror" | "declined", "opt_out": bool}"""
    kw = {"transport_errors_unknown": False} if params.get("opt_out") else {}
    try:
        await ctx.effect("charge", transport_error(params["kind"]), **kw)
    except Exception as exc:
        return f"failed: {type(exc).__name__}"
    return "charged"


def slow_remote(eid: str, seconds: float, idempotency_key: str) -> dict:
    """An effect whose answer takes `seconds`; counts its calls in files."""
    mark("start", eid, "remote")
    time.sleep(seconds)
    mark("end", eid, "remote")
    return {"receipt": idempotency_key, "pid": os.getpid()}


@workflow("hard-slow-effect")
async def hard_slow_effect(ctx: WorkflowContext, params: dict) -> dict:
    return await ctx.effect("remote", slow_remote, ctx.execution_id,
                            float(params.get("seconds", 2.0)))


# ------------------------------------------------------------ large values


@workflow("hard-big")
async def hard_big(ctx: WorkflowContext, params: dict):
    """params: {"where": "step" | "result", "bytes": int}"""
    big = "x" * int(params["bytes"])
    if params["where"] == "step":
        try:
            await ctx.step("big", lambda: big)
        except Exception as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        return {"error": None}
    return big


# ------------------------------------------------------ transactional steps


@workflow("hard-sleepy")
async def hard_sleepy(ctx: WorkflowContext, params: dict) -> str:
    """Suspends on a long timer first (tests move its due time), then a step."""
    await ctx.sleep("nap", 3600)
    return await ctx.step("after", lambda: "after")


async def _long_tx(conn, seconds: float) -> str:
    await conn.execute("SELECT pg_sleep($1)", seconds)
    return "done"


@workflow("hard-long-tx")
async def hard_long_tx(ctx: WorkflowContext, params: dict) -> str:
    return await ctx.transaction("tx", _long_tx, float(params["seconds"]))


_tx_attempts: dict[str, int] = {}


async def _conflicting_tx(conn, eid: str, fail_times: int) -> dict:
    n = _tx_attempts[eid] = _tx_attempts.get(eid, 0) + 1
    if n <= fail_times:
        # The user's own SQL fails as a serializable transaction would.
        await conn.execute(
            "DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' "
            "USING ERRCODE = '40001'; END $$")
    return {"attempt": n}


@workflow("hard-tx-conflict")
async def hard_tx_conflict(ctx: WorkflowContext, params: dict) -> dict:
    return await ctx.transaction("tx", _conflicting_tx, ctx.execution_id,
                                 int(params["fail_times"]))


@workflow("hard-hang-finally")
async def hard_hang_finally(ctx: WorkflowContext, params: dict) -> str:
    """A step that never returns, with a cleanup step in `finally:`."""
    try:
        return await ctx.step("hang", hang_async, ctx.execution_id, 3600.0)
    finally:
        await ctx.step("cleanup", lambda: _count("cleanup"))
