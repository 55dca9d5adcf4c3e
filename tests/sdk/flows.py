"""Workflows used by the in-process SDK and worker tests (IDs prefixed `sdk-`).

Loaded with `load_workflows(["tests.sdk.flows"])`. Step functions count their
calls in module-level state keyed by execution ID; `reset()` (an autouse
fixture in conftest.py) clears it before every test.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from app.sdk import (
    Retry,
    RetryPolicy,
    SignalTimeout,
    StepFailed,
    WorkflowContext,
    workflow,
)

# ------------------------------------------------------------------ test state

CALLS: collections.Counter = collections.Counter()  # (execution_id, what) -> calls
SEEN: dict[str, list] = collections.defaultdict(list)  # execution_id -> observations
STATE: dict[str, Any] = {}
GATES: dict[str, asyncio.Event] = {}
THREAD_GATES: dict[str, threading.Event] = {}
STEP_VERSION: dict[str, str] = {}  # execution_id -> which function sdk-fn-changed calls
STORE: dict[str, Any] = {}  # "store": the test's ExecutionStore, for sdk-wake-during


def reset() -> None:
    CALLS.clear()
    SEEN.clear()
    GATES.clear()
    THREAD_GATES.clear()
    STEP_VERSION.clear()
    STORE.clear()
    STATE.clear()
    STATE.update(inflight=0, max_inflight=0, barrier_inside=0, barrier=asyncio.Event())


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


def thread_gate(name: str) -> threading.Event:
    if name not in THREAD_GATES:
        THREAD_GATES[name] = threading.Event()
    return THREAD_GATES[name]


# -------------------------------------------------------------- step functions


async def count_step(execution_id: str, what: str) -> str:
    bump(execution_id, what)
    await asyncio.sleep(0.01)
    return what


async def wait_gate(execution_id: str) -> str:
    """A slow step: waits for the test to open gate(execution_id)."""
    bump(execution_id, "slow:start")
    try:
        await asyncio.wait_for(gate(execution_id).wait(), timeout=30)
    except asyncio.CancelledError:
        bump(execution_id, "slow:cancelled")
        raise
    bump(execution_id, "slow:end")
    return "slow-done"


async def sleep_step(execution_id: str, seconds: float) -> str:
    bump(execution_id, "slow:start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        bump(execution_id, "slow:cancelled")
        raise
    bump(execution_id, "slow:end")
    return "slept"


# ------------------------------------------------------------------ workflows


@workflow("sdk-return")
async def returns_result(ctx: WorkflowContext, p: dict) -> dict:
    bump(ctx.execution_id, "run")
    return {
        "answer": 42,
        "params": p,
        "executionId": ctx.execution_id,
        "workflowId": ctx.workflow_id,
        "paramsIsCtxParams": ctx.params is p,
    }


class Order(BaseModel):
    order_id: int = Field(gt=0)
    note: str = "none"


@workflow("sdk-params-model", params=Order)
async def params_model(ctx: WorkflowContext, p: Order) -> dict:
    return {"type": type(p).__name__, "orderId": p.order_id, "note": p.note,
            "ctxParams": ctx.params is p}


@workflow("sdk-replay")
async def replay(ctx: WorkflowContext, p: dict) -> dict:
    """step -> short real sleep -> step: the first step runs once across the
    suspension; the workflow body itself runs once per delivery."""
    eid = ctx.execution_id
    bump(eid, "body")
    a = await ctx.step("before", count_step, eid, "before")
    await ctx.sleep("nap", p["seconds"])
    b = await ctx.step("after", count_step, eid, "after")
    return {"before": a, "after": b}


@workflow("sdk-sleep")
async def sleeps(ctx: WorkflowContext, p: dict) -> str:
    eid = ctx.execution_id
    await ctx.step("before", count_step, eid, "before")
    await ctx.sleep("nap", timedelta(hours=1))
    await ctx.step("after", count_step, eid, "after")
    return "woke"


@workflow("sdk-sleep-until")
async def sleeps_until(ctx: WorkflowContext, p: dict) -> str:
    await ctx.sleep_until("until", datetime.fromisoformat(p["until"]))
    await ctx.step("after", count_step, ctx.execution_id, "after")
    return "woke"


@workflow("sdk-signals")
async def two_signals(ctx: WorkflowContext, p: dict) -> list:
    eid = ctx.execution_id
    bump(eid, "body")
    first = await ctx.wait_for_signal("go", key="first")
    await ctx.step("between", count_step, eid, "between")
    second = await ctx.wait_for_signal("go", key="second")
    return [first, second]


@workflow("sdk-signal-timeout")
async def signal_timeout(ctx: WorkflowContext, p: dict) -> dict:
    eid = ctx.execution_id
    try:
        payload = await ctx.wait_for_signal("approval", timeout=3600)
        outcome: dict = {"payload": payload}
    except SignalTimeout as exc:
        bump(eid, "timeout-branch")
        outcome = {"timeout": exc.step_key, "signal": exc.signal_name}
    await ctx.sleep("after", timedelta(hours=1))
    return outcome


@workflow("sdk-signal-timeout-uncaught")
async def signal_timeout_uncaught(ctx: WorkflowContext, p: dict) -> Any:
    bump(ctx.execution_id, "body")
    return await ctx.wait_for_signal("approval", timeout=p.get("timeout", 0))


@workflow("sdk-oserror")
async def raises_oserror(ctx: WorkflowContext, p: dict) -> Any:
    bump(ctx.execution_id, "body")
    raise FileNotFoundError(2, "No such file or directory", "/nonexistent/config.json")


def flaky(execution_id: str) -> str:
    n = bump(execution_id, "flaky")
    if n <= 2:
        raise RuntimeError(f"flaky failure {n}")
    return f"ok after {n}"


@workflow("sdk-retry-succeeds")
async def retry_succeeds(ctx: WorkflowContext, p: dict) -> str:
    return await ctx.step("flaky", flaky, ctx.execution_id,
                          retry=RetryPolicy(max_attempts=3, initial_interval=0.01))


class Declined(ValueError):
    pass


async def strict(execution_id: str) -> str:
    bump(execution_id, "strict")
    raise Declined("card declined")


@workflow("sdk-non-retryable")
async def non_retryable(ctx: WorkflowContext, p: dict) -> dict:
    policy = RetryPolicy(max_attempts=5, initial_interval=0.01, non_retryable=(ValueError,))
    try:
        await ctx.step("charge", strict, ctx.execution_id, retry=policy)
    except StepFailed as exc:
        return {"stepKey": exc.step_key, "name": exc.error_name, "message": exc.error_message}
    return {"stepKey": None}


def doomed(execution_id: str) -> str:
    n = bump(execution_id, "doomed")
    raise RuntimeError(f"attempt {n} failed")


@workflow("sdk-exhausted")
async def exhausted(ctx: WorkflowContext, p: dict) -> dict:
    eid = ctx.execution_id
    try:
        await ctx.step("doomed", doomed, eid,
                       retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
        caught: dict = {"caught": False}
    except StepFailed as exc:
        bump(eid, "caught")
        caught = {"caught": True, "stepKey": exc.step_key, "name": exc.error_name,
                  "message": exc.error_message}
    # Suspend once so the recorded failure is replayed by a second delivery.
    await ctx.sleep("after", 0.2)
    return caught


class NotJson:
    pass


NON_JSON_VALUES = {
    "set": lambda: {1, 2},
    "nan": lambda: float("nan"),
    "object": lambda: {"nested": NotJson()},
    "nul": lambda: "nul\u0000byte",
    "surrogate": lambda: "lone\ud800surrogate",
}


def non_json(execution_id: str, kind: str) -> Any:
    bump(execution_id, "non-json")
    return NON_JSON_VALUES[kind]()


@workflow("sdk-non-json-step")
async def non_json_step(ctx: WorkflowContext, p: dict) -> Any:
    return await ctx.step("produce", non_json, ctx.execution_id, p["kind"])


@workflow("sdk-non-json-result")
async def non_json_result(ctx: WorkflowContext, p: dict) -> Any:
    bump(ctx.execution_id, "body")
    return NON_JSON_VALUES[p["kind"]]()


@workflow("sdk-dup-key")
async def dup_key(ctx: WorkflowContext, p: dict) -> Any:
    eid = ctx.execution_id
    await ctx.step("dup", count_step, eid, "dup")
    await ctx.step("dup", count_step, eid, "dup")
    return "unreachable"


async def load_v1(execution_id: str) -> str:
    bump(execution_id, "v1")
    return "v1"


async def load_v2(execution_id: str) -> str:
    bump(execution_id, "v2")
    return "v2"


@workflow("sdk-fn-changed")
async def fn_changed(ctx: WorkflowContext, p: dict) -> str:
    eid = ctx.execution_id
    fn = load_v2 if STEP_VERSION.get(eid) == "v2" else load_v1
    value = await ctx.step("load", fn, eid)
    await ctx.sleep("nap", timedelta(hours=1))
    return value


def blocking_step(execution_id: str) -> dict:
    """Sync: blocks its thread until the other execution opens the gate."""
    bump(execution_id, "blocking:start")
    released = thread_gate("sync").wait(timeout=5)
    return {"released": released,
            "offMainThread": threading.current_thread() is not threading.main_thread()}


@workflow("sdk-sync-blocker")
async def sync_blocker(ctx: WorkflowContext, p: dict) -> dict:
    return await ctx.step("block", blocking_step, ctx.execution_id)


async def open_thread_gate(execution_id: str) -> str:
    bump(execution_id, "opened")
    thread_gate("sync").set()
    return "opened"


@workflow("sdk-sync-releaser")
async def sync_releaser(ctx: WorkflowContext, p: dict) -> str:
    return await ctx.step("release", open_thread_gate, ctx.execution_id)


@workflow("sdk-retry-reply")
async def retry_reply(ctx: WorkflowContext, p: dict) -> dict:
    """Replies retry until delivery `succeedOn`; optionally waits at a gate
    on delivery `holdOn` so the test can read the record mid-delivery."""
    eid = ctx.execution_id
    SEEN[eid].append(ctx.attempt)
    if ctx.attempt < p["succeedOn"]:
        raise Retry(f"not yet (delivery {ctx.attempt})")
    if p.get("holdOn") == ctx.attempt:
        await gate(eid).wait()
    if p.get("thenWait"):
        await ctx.wait_for_signal("continue")
    return {"attempt": ctx.attempt}


class Boom(Exception):
    pass


def explode() -> None:
    raise Boom("kaboom")


@workflow("sdk-boom")
async def boom(ctx: WorkflowContext, p: dict) -> Any:
    bump(ctx.execution_id, "body")
    explode()


@workflow("sdk-context")
async def context_readonly(ctx: WorkflowContext, p: dict) -> dict:
    try:
        ctx.context["tenant"] = "evil"  # type: ignore[index]
        mutated = True
    except TypeError:
        mutated = False
    try:
        del ctx.context["tenant"]  # type: ignore[attr-defined]
        deleted = True
    except TypeError:
        deleted = False
    return {"context": dict(ctx.context), "mutated": mutated, "deleted": deleted}


@workflow("sdk-counted")
async def counted(ctx: WorkflowContext, p: dict) -> str:
    bump(ctx.execution_id, "body")
    await ctx.step("only", count_step, ctx.execution_id, "only")
    return "done"


async def ask_wake(execution_id: str, seconds: float) -> str:
    """Requests a wake for its own execution through the store, mid-delivery."""
    store = STORE["store"]
    at = await store.clock.db_now() + timedelta(seconds=seconds)
    assert await store.operator.request_wake(execution_id, at) == "requested"
    return at.isoformat()


@workflow("sdk-wake-during")
async def wake_during(ctx: WorkflowContext, p: dict) -> Any:
    eid = ctx.execution_id
    bump(eid, "body")
    await ctx.step("ask-wake", ask_wake, eid, p["seconds"])
    # Suspends with no timer of its own: only the wake requested above (and
    # the signal) can bring it back.
    return await ctx.wait_for_signal("done")


@workflow("sdk-slow-step")
async def slow_step(ctx: WorkflowContext, p: dict) -> str:
    return await ctx.step("slow", sleep_step, ctx.execution_id, p["seconds"])


@workflow("sdk-drain")
async def drain_flow(ctx: WorkflowContext, p: dict) -> dict:
    """Delivery 1 runs a long step (the worker is stopped meanwhile); later
    deliveries finish quickly."""
    seconds = p["seconds"] if ctx.attempt == 1 else 0.01
    await ctx.step(f"slow-{ctx.attempt}", sleep_step, ctx.execution_id, seconds)
    return {"attempt": ctx.attempt}


@workflow("sdk-gated")
async def gated(ctx: WorkflowContext, p: dict) -> str:
    eid = ctx.execution_id
    value = await ctx.step("slow", wait_gate, eid)
    await ctx.step("after", count_step, eid, "after")
    return value


@workflow("sdk-stale-ack")
async def stale_ack(ctx: WorkflowContext, p: dict) -> dict:
    """Waits (outside any step: no fenced write) at a gate per delivery, then
    returns which delivery it was."""
    eid = ctx.execution_id
    attempt = ctx.attempt
    bump(eid, f"start:{attempt}")
    try:
        await asyncio.wait_for(gate(f"{eid}:{attempt}").wait(), timeout=30)
    except asyncio.CancelledError:
        bump(eid, f"cancelled:{attempt}")
        raise
    bump(eid, f"returned:{attempt}")
    return {"by": attempt}


@workflow("sdk-gate-then-end")
async def gate_then_end(ctx: WorkflowContext, p: dict) -> str:
    """Delivery 1 waits at gate(execution_id), then returns or replies Retry
    (`p["end"]`); later deliveries return at once."""
    if ctx.attempt == 1:
        await asyncio.wait_for(gate(ctx.execution_id).wait(), timeout=30)
        if p["end"] == "retry":
            raise Retry("ending delivery 1 by a release")
    return "done"


async def meet(execution_id: str, n: int) -> bool:
    """Waits until `n` deliveries are inside this step at once (5 s at most)."""
    STATE["barrier_inside"] += 1
    if STATE["barrier_inside"] >= n:
        STATE["barrier"].set()
    try:
        await asyncio.wait_for(STATE["barrier"].wait(), timeout=5)
        return True
    except TimeoutError:
        return False


@workflow("sdk-barrier")
async def barrier(ctx: WorkflowContext, p: dict) -> bool:
    return await ctx.step("meet", meet, ctx.execution_id, p["n"])


def meet_in_threads(execution_id: str, n: int) -> bool:
    """Sync: waits in its thread until `n` threads are inside at once (3 s at most)."""
    try:
        STATE["thread_barrier"].wait(timeout=3)
        return True
    except threading.BrokenBarrierError:
        return False


@workflow("sdk-thread-barrier")
async def thread_barrier(ctx: WorkflowContext, p: dict) -> bool:
    return await ctx.step("meet", meet_in_threads, ctx.execution_id, p["n"])


async def short_work(execution_id: str) -> str:
    await asyncio.sleep(0.05)
    return "worked"


@workflow("sdk-inflight")
async def inflight(ctx: WorkflowContext, p: dict) -> str:
    STATE["inflight"] += 1
    STATE["max_inflight"] = max(STATE["max_inflight"], STATE["inflight"])
    try:
        return await ctx.step("work", short_work, ctx.execution_id)
    finally:
        STATE["inflight"] -= 1


@workflow("sdk-multi")
async def multi(ctx: WorkflowContext, p: dict) -> list:
    """Three steps around a short sleep; some executions decline their first
    delivery, so deliveries move between dispatchers."""
    eid = ctx.execution_id
    if p.get("retryFirst") and ctx.attempt == 1:
        raise Retry("declining the first delivery")
    a = await ctx.step("one", count_step, eid, "one")
    await ctx.sleep("nap", 0.05)
    b = await ctx.step("two", count_step, eid, "two")
    c = await ctx.step("three", count_step, eid, "three")
    return [a, b, c]
