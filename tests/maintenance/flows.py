"""Workflows for the metrics test."""

from app.sdk import Retry, workflow


@workflow("mnt-ok")
async def ok(ctx, params):
    await ctx.step("one", lambda: 1)
    return "ok"


@workflow("mnt-retry-once")
async def retry_once(ctx, params):
    if ctx.attempt == 1:
        raise Retry("first delivery gives up")
    return "second time"


@workflow("mnt-versioned", version="2026-11-29.1")
async def versioned(ctx, params):
    return "v"
