"""Workflows with cleanup code, for cancellation and deadline tests (issue 19
items 1 and 2). Run by real `fencepost worker` processes
(`--workflows tests.authors.cleanupflows`) and by in-process workers; every
workflow ID starts with `clean-`. Step functions leave evidence with
tests.worker_processes.flows.mark (files, so they survive a process)."""

from __future__ import annotations

import asyncio

from app.sdk import Cancelled, DeadlineExceeded, WorkflowContext, workflow
from tests.worker_processes.flows import mark


def reserve(eid: str) -> str:
    mark("start", eid, "reserve")
    return "held"


def release(eid: str, why: str) -> str:
    mark("start", eid, "release")
    return f"released ({why})"


def ship(eid: str) -> str:
    mark("start", eid, "ship")
    return "shipped"


def audit(eid: str) -> str:
    mark("start", eid, "audit")
    return "audited"


async def hang(eid: str) -> None:
    mark("start", eid, "hang")
    await asyncio.sleep(3600)


@workflow("clean-approval", cancel_grace=10)
async def clean_approval(ctx: WorkflowContext, params: dict) -> str:
    """Reserve, wait for a decision (a signal, optionally with a timeout),
    ship; a cancel or the deadline releases the reservation, and `finally:`
    writes an audit step either way."""
    eid = ctx.execution_id
    await ctx.step("reserve", reserve, eid)
    try:
        await ctx.wait_for_signal("decision", timeout=params.get("timeout"))
        return await ctx.step("ship", ship, eid)
    except Cancelled:
        await ctx.step("release", release, eid, "cancelled")
        raise
    except DeadlineExceeded:
        await ctx.step("release", release, eid, "deadline")
        raise
    finally:
        await ctx.step("audit", audit, eid)


@workflow("clean-sleep", cancel_grace=10)
async def clean_sleep(ctx: WorkflowContext, params: dict) -> str:
    eid = ctx.execution_id
    await ctx.step("reserve", reserve, eid)
    try:
        await ctx.sleep("nap", params.get("seconds", 3600))
        return await ctx.step("ship", ship, eid)
    finally:
        await ctx.step("release", release, eid, "finally")


@workflow("clean-child")
async def clean_child(ctx: WorkflowContext, params: dict) -> str:
    await ctx.sleep("nap", 3600)
    return "child done"


@workflow("clean-parent", cancel_grace=10)
async def clean_parent(ctx: WorkflowContext, params: dict) -> str:
    eid = ctx.execution_id
    child = await ctx.start_child("kid", "clean-child")
    try:
        return await ctx.wait_for_child("kid-done", child)
    except Cancelled:
        await ctx.step("release", release, eid, "cancelled")
        raise


@workflow("clean-hung-cleanup", cancel_grace=2)
async def clean_hung_cleanup(ctx: WorkflowContext, params: dict) -> str:
    """Cleanup that never returns: bounded by the 2 s grace."""
    try:
        await ctx.wait_for_signal("decision")
        return "decided"
    except Cancelled:
        await ctx.step("hang", hang, ctx.execution_id)
        raise


@workflow("clean-swallow", cancel_grace=10)
async def clean_swallow(ctx: WorkflowContext, params: dict) -> str:
    """Catches Cancelled and returns as if nothing happened: cancel still wins."""
    try:
        await ctx.wait_for_signal("decision")
    except Cancelled:
        await ctx.step("release", release, ctx.execution_id, "swallowed")
    return "pretended to finish"


@workflow("clean-wait-in-cleanup", cancel_grace=10)
async def clean_wait_in_cleanup(ctx: WorkflowContext, params: dict) -> str:
    """Cleanup that tries to wait: the wait raises the cancel again."""
    try:
        await ctx.wait_for_signal("decision")
        return "decided"
    except Cancelled:
        try:
            await ctx.sleep("cool-down", 60)
        finally:
            await ctx.step("release", release, ctx.execution_id, "after a refused wait")
        raise


@workflow("clean-no-grace", cancel_grace=0)
async def clean_no_grace(ctx: WorkflowContext, params: dict) -> str:
    """cancel_grace=0: no cleanup delivery; a cancel ends it at once."""
    try:
        await ctx.wait_for_signal("decision")
        return "decided"
    finally:
        await ctx.step("release", release, ctx.execution_id, "finally")
