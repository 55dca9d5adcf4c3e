"""Workflows for the step-key, attempt-history and effect-retry tests
(`author-*`), run by in-process workers."""

from __future__ import annotations

from app.sdk import Retry, RetryPolicy, WorkflowContext, workflow

CALLS: dict[str, int] = {}


def count(name: str) -> int:
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name]


@workflow("author-items")
async def author_items(ctx: WorkflowContext, params: dict) -> list:
    """Waits for `n` signals `item`, with no keys: signal:item, signal:item#2, ..."""
    return [await ctx.wait_for_signal("item") for _ in range(int(params["n"]))]


@workflow("author-bad-key")
async def author_bad_key(ctx: WorkflowContext, params: dict) -> str:
    return await ctx.step(params["key"], lambda: "ran")


def flaky(eid: str, fail_times: int) -> str:
    n = count(f"flaky:{eid}")
    if n <= fail_times:
        raise ConnectionRefusedError(f"attempt {n}: the downstream refused")
    return f"ok after {n}"


@workflow("author-retried-step")
async def author_retried_step(ctx: WorkflowContext, params: dict) -> str:
    return await ctx.step("call", flaky, ctx.execution_id, int(params["fail_times"]),
                          retry=RetryPolicy(max_attempts=int(params.get("attempts", 5)),
                                            initial_interval=0.01, backoff=1))


@workflow("author-retry-reason")
async def author_retry_reason(ctx: WorkflowContext, params: dict) -> str:
    if count(f"retry:{ctx.execution_id}") <= int(params["times"]):
        raise Retry("the inventory service is in maintenance")
    return "done"


def charge(eid: str, fail_times: int, *, idempotency_key: str) -> dict:
    n = count(f"charge:{eid}")
    CALLS.setdefault(f"keys:{eid}:{idempotency_key}", 0)
    CALLS[f"keys:{eid}:{idempotency_key}"] += 1
    if n <= fail_times:
        raise RuntimeError(f"503 from the provider (attempt {n})")
    return {"charged": True, "key": idempotency_key}


@workflow("author-effect-retry")
async def author_effect_retry(ctx: WorkflowContext, params: dict) -> dict:
    return await ctx.effect("charge", charge, ctx.execution_id, int(params["fail_times"]),
                            retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
