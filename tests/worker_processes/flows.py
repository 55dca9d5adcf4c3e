"""Workflows run by real `fencepost worker` processes in these tests
(`--workflows tests.worker_processes.flows`). Every workflow ID starts with `acc-`.

Step functions leave evidence as files in the directory named by the
`ACC_MARK_DIR` environment variable: one small JSON file per event
(`{"event": "start" | "resumed" | "end", "eid", "step", "pid", "at"}`), written to a
temporary name and renamed, so a reader never sees half a file. From these the
test knows that a worker is inside a step (a `start` without an `end`), and
counts how often each step *function* ran and in which process (at-least-once,
allowed to be more than once) apart from how often each step was *recorded*
(read from the database; exactly once). Files rather than a table, so that
the evidence survives a Postgres restart and costs the step no connection.

This module is imported by the worker processes only; tests read the files
through `harness.calls()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

from app.sdk import WorkflowContext, workflow

# A gap this long between two short sleeps means the process was stopped
# (SIGSTOP) and continued (SIGCONT).
PAUSE_GAP_SECONDS = 1.0


def _mark_dir() -> Path:
    return Path(os.environ["ACC_MARK_DIR"])


def mark(event: str, eid: str, step: str) -> None:
    d = _mark_dir()
    name = f"{event}-{os.getpid()}-{uuid.uuid4().hex}"
    tmp = d / f".{name}.tmp"
    tmp.write_text(json.dumps({"event": event, "eid": eid, "step": step, "pid": os.getpid(),
                               "at": time.time()}))
    tmp.rename(d / f"{name}.json")


def _started_before(eid: str, step: str) -> bool:
    for path in _mark_dir().glob("start-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data["eid"] == eid and data["step"] == step:
            return True
    return False


async def _until_resumed(cap: float) -> None:
    """Block until the process has been paused and continued, or `cap` passes."""
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        before = time.monotonic()
        await asyncio.sleep(0.02)
        if time.monotonic() - before > PAUSE_GAP_SECONDS:
            return


async def run_step(eid: str, step: str, seconds: float = 0.0, block_first: float = 0.0,
                   block_mode: str = "sleep", after_resume: float = 0.0) -> dict:
    """The one step function. `seconds`: how long the work takes. `block_first`:
    on the first call of this (execution, step) across all processes, block
    instead: `sleep` that long, or (`until_resumed`) until the process was
    paused and continued, at most that long, and then `after_resume` seconds
    more. Returns the caller's pid so the recorded value names the worker whose
    write was accepted."""
    first = not _started_before(eid, step)
    mark("start", eid, step)
    if block_first and first:
        if block_mode == "until_resumed":
            await _until_resumed(block_first)
            mark("resumed", eid, step)
            await asyncio.sleep(after_resume)
        else:
            await asyncio.sleep(block_first)
    elif seconds:
        await asyncio.sleep(seconds)
    mark("end", eid, step)
    return {"pid": os.getpid(), "step": step}


@workflow("acc-steps")
async def acc_steps(ctx: WorkflowContext, params: dict) -> dict:
    """params: {"steps": [{"key": str, "seconds": float?, "block_first": float?,
    "block_mode": "sleep" | "until_resumed"?, "after_resume": float?}, ...]}; returns {key: step value}."""
    out = {}
    for spec in params["steps"]:
        key = spec["key"]
        out[key] = await ctx.step(
            key, run_step, ctx.execution_id, key, float(spec.get("seconds", 0.0)),
            float(spec.get("block_first", 0.0)), spec.get("block_mode", "sleep"),
            float(spec.get("after_resume", 0.0)),
        )
    return out


@workflow("acc-tail")
async def acc_tail(ctx: WorkflowContext, params: dict) -> dict:
    """One step, then workflow code outside any step that takes a while (how
    long depends on the delivery: params {"tail_seconds": {"1": s, "2": s}},
    keyed by ctx.attempt); returns the attempt so the outcome names the
    delivery whose acknowledgement was accepted."""
    one = await ctx.step("one", run_step, ctx.execution_id, "one")
    tail = f"tail-{ctx.attempt}"
    mark("start", ctx.execution_id, tail)
    await asyncio.sleep(float(params.get("tail_seconds", {}).get(str(ctx.attempt), 0.0)))
    mark("end", ctx.execution_id, tail)
    return {"attempt": ctx.attempt, "pid": os.getpid(), "one": one}
