"""Workflows for the patch and nondeterminism tests (IDs prefixed `ver-sdk-`).

The code a delivery runs is chosen by the module-level switch `CODE["now"]`,
read when the workflow body runs: a test flips it between deliveries, as a
deploy replaces the code between an execution's deliveries. Step functions
count their calls in CALLS (keyed by execution ID and what ran), so a test
can tell a recorded step replayed from one that ran; SEEN keeps what workflow
code observed per delivery (e.g. each `ctx.patched` decision).

Loaded in-process with `load_workflows(["tests.sdk.versionflows"])`;
`reset()` clears the state before every test.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from app.sdk import SignalTimeout, WorkflowContext, workflow

CALLS: collections.Counter = collections.Counter()  # (execution_id, what) -> calls
SEEN: dict[str, list] = collections.defaultdict(list)  # execution_id -> observations
CODE: dict[str, str] = {}  # "now": which code the next delivery runs

HOUR = 3600.0


def reset() -> None:
    CALLS.clear()
    SEEN.clear()
    CODE.clear()
    CODE["now"] = "v1"


reset()


def calls(execution_id: str, what: str) -> int:
    return CALLS[(execution_id, what)]


def ran(execution_id: str) -> list[str]:
    """What step functions ran for this execution (each once per call)."""
    return sorted(what for (eid, what), n in CALLS.items() if eid == execution_id
                  for _ in range(n))


async def note(execution_id: str, what: str) -> str:
    CALLS[(execution_id, what)] += 1
    await asyncio.sleep(0.01)
    return what


# ------------------------------------------------------------------ patches


@workflow("ver-sdk-patch")
async def patch_flow(ctx: WorkflowContext, p: Any) -> list[str]:
    """Step `a`, a sleep, then the code under change (CODE["now"]):
    "old" runs `b`; "patched" asks ctx.patched("fix") and runs `b2` (new) or
    `b` (old); "deprecated" deprecates the patch and runs `b2`; "removed"
    just runs `b2`. Then a sleep and step `c`."""
    eid = ctx.execution_id
    path = [await ctx.step("a", note, eid, "a")]
    await ctx.sleep("nap1", HOUR)
    code = CODE["now"]
    if code == "patched":
        decision = await ctx.patched("fix")
        SEEN[eid].append(decision)
        new = decision
    elif code == "deprecated":
        ctx.deprecate_patch("fix")
        new = True
    else:
        new = code == "removed"
    if new:
        path.append(await ctx.step("b2", note, eid, "new-b"))
    else:
        path.append(await ctx.step("b", note, eid, "old-b"))
    await ctx.sleep("nap2", HOUR)
    path.append(await ctx.step("c", note, eid, "c"))
    return path


# ------------------------------------------------------------ nondeterminism


async def must_not_run(execution_id: str, what: str) -> str:
    """A step function the test expects never to run (counted if it does)."""
    CALLS[(execution_id, f"forbidden:{what}")] += 1
    return what


@workflow("ver-sdk-shape")
async def shape(ctx: WorkflowContext, p: Any) -> str:
    """"v1": a, b, sleep `nap`, c. The others are the same code changed
    (CODE["now"]): "insert" asks a new step `x` first; "swap" asks b before
    a; "early" returns after a; "other" asks `d` where b was; "guarded" is
    "insert" inside `try/except BaseException` (which tries a step `rescue`)
    and `finally:` (a step `cleanup`); "swallow" is "insert" inside a
    `try/except BaseException` that returns normally; "append" is v1 with a
    new step `y` after the sleep (past the history of one sleeping there:
    a compatible change)."""
    eid = ctx.execution_id
    code = CODE["now"]
    if code == "insert":
        await ctx.step("x", must_not_run, eid, "x")
    if code == "swap":
        await ctx.step("b", note, eid, "b")
        await ctx.step("a", note, eid, "a")
    elif code == "early":
        await ctx.step("a", note, eid, "a")
        return "early"
    elif code == "other":
        await ctx.step("a", note, eid, "a")
        await ctx.step("d", must_not_run, eid, "d")
    elif code == "guarded":
        try:
            await ctx.step("x", must_not_run, eid, "x")
        except BaseException as exc:
            SEEN[eid].append(type(exc).__name__)
            await ctx.step("rescue", must_not_run, eid, "rescue")
        finally:
            SEEN[eid].append("finally")
            await ctx.step("cleanup", must_not_run, eid, "cleanup")
    elif code == "swallow":
        try:
            await ctx.step("x", must_not_run, eid, "x")
        except BaseException as exc:
            SEEN[eid].append(type(exc).__name__)
            return "swallowed"
    else:
        await ctx.step("a", note, eid, "a")
        await ctx.step("b", note, eid, "b")
    await ctx.sleep("nap", HOUR)
    if code == "append":
        await ctx.step("y", note, eid, "y")
    await ctx.step("c", note, eid, "c")
    return "done"


# ------------------------------------------------------ no false divergence


@workflow("ver-sdk-gather")
async def gathered(ctx: WorkflowContext, p: Any) -> dict:
    """Step a; three steps gathered; a sleep; a step gathered with a sleep;
    another sleep; step z. Four deliveries, each replaying the gathers."""
    eid = ctx.execution_id
    first = await ctx.step("a", note, eid, "a")
    many = await asyncio.gather(*(ctx.step(f"g{i}", note, eid, f"g{i}") for i in range(3)))
    await ctx.sleep("nap1", HOUR)
    paired = await asyncio.gather(ctx.step("h", note, eid, "h"), ctx.sleep("hs", HOUR))
    await ctx.sleep("nap2", HOUR)
    last = await ctx.step("z", note, eid, "z")
    return {"first": first, "many": list(many), "paired": paired[0], "last": last}


@workflow("ver-sdk-signal")
async def signalled(ctx: WorkflowContext, p: Any) -> dict:
    """Step a; wait for signal `go` with a timeout (its timer recorded by the
    delivery that suspends; its timing out is caught); step b; a sleep; step c."""
    eid = ctx.execution_id
    await ctx.step("a", note, eid, "a")
    try:
        payload = await ctx.wait_for_signal("go", timeout=HOUR)
    except SignalTimeout:
        payload = "timed out"
    await ctx.step("b", note, eid, "b")
    await ctx.sleep("nap", HOUR)
    await ctx.step("c", note, eid, "c")
    return {"payload": payload}


@workflow("ver-sdk-patch-twice")
async def patch_twice(ctx: WorkflowContext, p: Any) -> list:
    """One change asked about at two points (a loop's body patched): each ask
    answers the same as the first."""
    eid = ctx.execution_id
    out = []
    for i in range(2):
        decision = await ctx.patched("loop")
        out.append([decision, await ctx.step(f"item-{i}", note, eid, f"item-{i}")])
    await ctx.sleep("nap", HOUR)
    return out
