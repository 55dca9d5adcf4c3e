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


class PaymentDeclined(Exception):
    pass


@workflow("mnt-fails")
async def fails(ctx, params):
    raise PaymentDeclined("card 4111-secret declined")


@workflow("mnt-always-retry")
async def always_retry(ctx, params):
    raise Retry("the ledger is closed")
