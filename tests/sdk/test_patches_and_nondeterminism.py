"""Patches and the run-time replay check, through real in-process workers on
Postgres, with the code changed between deliveries (versionflows.CODE, read
when the workflow body runs, as a deploy replaces code between deliveries).

- `ctx.patched`: an execution whose history went past the patch point before
  the patch takes the old path (False, nothing recorded); a new one takes the
  new path (True, marker `patch#<id>` recorded); every later delivery agrees
  with its first decision. `deprecate_patch` replays both an execution with
  the marker and one without; removing the call parks one with the marker
  (nondeterminism) and not one without.
- A replay that asks for another step than the recorded one at a position
  (inserted, swapped, removed, replaced) parks the execution (reason
  `nondeterminism`, the first divergence in `parked_detail`), runs no step
  function for the diverging ask, and workflow code that catches the
  divergence (`except BaseException`, `finally:`) cannot run new steps.
- No false divergence: gathered steps (and a step gathered with a sleep),
  a signal wait whose timeout timer was recorded by an earlier delivery,
  and steps recorded before positions were (position NULL) replay fine.

Time moves by fast_forward_timer (database time), never by sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.sdk import versionflows as vf
from tests.support.admission import admit
from tests.support.clocks import fast_forward_timer
from tests.support.history import events_of, step_rows
from tests.support.waiting import wait_status, wait_until
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.sdk.versionflows"])
assert WORKFLOWS and all(w.startswith("ver-sdk-") for w in WORKFLOWS), sorted(WORKFLOWS)


@pytest.fixture(autouse=True)
def _reset_versionflows() -> None:
    vf.reset()


@pytest_asyncio.fixture
async def worker(sdk_settings: Settings, store: ExecutionStore) -> AsyncIterator[InProcessWorkers]:
    running = InProcessWorkers(sdk_settings, WORKFLOWS)
    await running.start()
    try:
        yield running
    finally:
        await running.stop_all()


async def suspended_at(store, pool, eid: str, key: str) -> None:
    """Wait until `eid` is suspended with timer `key` recorded."""
    async def there() -> bool:
        record = await store.history.get(eid)
        return record["status"] == "suspended" and key in await step_rows(pool, eid)

    await wait_until(there, what=f"{eid} suspended at {key}")


async def wake(store, pool, eid: str, key: str) -> None:
    """Let `eid`'s timer `key` fall due (its next delivery replays)."""
    await suspended_at(store, pool, eid, key)
    await fast_forward_timer(pool, eid, key)


async def positions(pool, eid: str) -> dict[str, int | None]:
    rows = await pool.fetch("SELECT step_key, position FROM execution_steps "
                            "WHERE execution_id = $1", eid)
    return {r["step_key"]: r["position"] for r in rows}


async def parked_divergence(store, eid: str) -> dict:
    record = await wait_status(store, eid, "parked")
    assert record["parked_reason"] == "nondeterminism", record
    assert record["outcome"] is None, record
    return record["parked_detail"]


# ------------------------------------------------------------------ patches


async def test_patched_is_false_for_history_past_the_patch_and_true_for_new_executions(
        store, pool, worker):
    vf.CODE["now"] = "old"
    old = await admit(store, "ver-sdk-patch", "patch-old")
    await wake(store, pool, old, "nap1")
    await suspended_at(store, pool, old, "nap2")  # went past the patch point

    vf.CODE["now"] = "patched"  # deployed: the patch exists from here on
    new = await admit(store, "ver-sdk-patch", "patch-new")
    await wake(store, pool, new, "nap1")
    await suspended_at(store, pool, new, "nap2")
    # Another delivery of each (after its second sleep) replays the decision.
    await wake(store, pool, old, "nap2")
    await wake(store, pool, new, "nap2")
    old_record = await wait_status(store, old, "completed")
    new_record = await wait_status(store, new, "completed")

    assert old_record["outcome"] == {"result": ["a", "old-b", "c"]}
    assert vf.SEEN[old] == [False]
    assert "patch#fix" not in await step_rows(pool, old)
    assert vf.calls(old, "old-b") == 1 and vf.calls(old, "new-b") == 0

    assert new_record["outcome"] == {"result": ["a", "new-b", "c"]}
    assert vf.SEEN[new] == [True, True]  # recorded once, replayed once
    marker = (await step_rows(pool, new))["patch#fix"]
    assert (marker["function_name"], marker["value"], marker["status"]) == (
        "patch", True, "completed")
    assert await positions(pool, new) == {"a": 0, "nap1": 1, "patch#fix": 2, "b2": 3,
                                          "nap2": 4, "c": 5}
    assert vf.calls(new, "new-b") == 1 and vf.calls(new, "old-b") == 0


async def test_deprecate_patch_replays_both_kinds_and_removing_it_parks_only_marked_ones(
        store, pool, worker):
    vf.CODE["now"] = "patched"
    marked = [await admit(store, "ver-sdk-patch", f"marked-{i}") for i in range(2)]
    for eid in marked:
        await wake(store, pool, eid, "nap1")
        await suspended_at(store, pool, eid, "nap2")
        assert "patch#fix" in await step_rows(pool, eid)

    vf.CODE["now"] = "deprecated"  # stage two: always the new path
    unmarked = [await admit(store, "ver-sdk-patch", f"unmarked-{i}") for i in range(2)]
    for eid in unmarked:
        await wake(store, pool, eid, "nap1")
        await suspended_at(store, pool, eid, "nap2")
        assert "patch#fix" not in await step_rows(pool, eid)
    # Both kinds replay under the deprecated call.
    for eid in (marked[0], unmarked[0]):
        await wake(store, pool, eid, "nap2")
        record = await wait_status(store, eid, "completed")
        assert record["outcome"] == {"result": ["a", "new-b", "c"]}

    vf.CODE["now"] = "removed"  # stage three: the call is gone
    await wake(store, pool, marked[1], "nap2")
    await wake(store, pool, unmarked[1], "nap2")

    divergence = await parked_divergence(store, marked[1])
    assert (divergence["position"], divergence["recorded"], divergence["asked"]) == (
        2, "patch#fix", "b2")
    record = await wait_status(store, unmarked[1], "completed")
    assert record["outcome"] == {"result": ["a", "new-b", "c"]}
    for eid in (*marked, *unmarked):
        assert vf.calls(eid, "new-b") == 1, eid  # each ran once, in its first delivery
    assert vf.calls(marked[1], "c") == 0


async def test_patched_asked_twice_for_one_change_answers_the_same_each_time(
        store, pool, worker):
    eid = await admit(store, "ver-sdk-patch-twice", "patch-twice")
    record = await wait_status(store, eid, "suspended", "failed")
    assert record["status"] == "suspended", record["outcome"]
    await wake(store, pool, eid, "nap")  # and a replay of both asks

    record = await wait_status(store, eid, "completed", "failed")

    assert record["outcome"] == {"result": [[True, "item-0"], [True, "item-1"]]}, record
    assert vf.ran(eid) == ["item-0", "item-1"]


# ------------------------------------------------------------ nondeterminism


async def run_v1_then_change(store, pool, eid: str, code: str) -> dict:
    """Run `eid` under v1 to its sleep (a, b recorded), change the code to
    `code`, wake it, and return its divergence once parked."""
    await suspended_at(store, pool, eid, "nap")
    assert await positions(pool, eid) == {"a": 0, "b": 1, "nap": 2}
    vf.CODE["now"] = code
    await fast_forward_timer(pool, eid, "nap")
    return await parked_divergence(store, eid)


@pytest.mark.parametrize(("code", "position", "recorded", "asked"), [
    ("insert", 0, "a", "x"),   # a new step before the recorded ones
    ("swap", 0, "a", "b"),     # two recorded steps in the other order
    ("other", 1, "b", "d"),    # a recorded step replaced by another
    ("early", 1, "b", None),   # the code returns before a recorded step
])
async def test_a_replay_that_diverges_parks_with_the_first_divergence(
        store, pool, worker, code, position, recorded, asked):
    eid = await admit(store, "ver-sdk-shape", f"shape-{code}")

    divergence = await run_v1_then_change(store, pool, eid, code)

    assert (divergence["position"], divergence["recorded"], divergence["asked"]) == (
        position, recorded, asked), divergence
    assert divergence["message"]
    record = await store.history.get(eid)
    assert record["parked_step"] == (asked or recorded)
    # Nothing new ran: no step function of the diverging ask, none after it,
    # and the recorded steps were replayed, not run again.
    assert vf.ran(eid) == ["a", "b"], vf.ran(eid)
    assert set(await step_rows(pool, eid)) == {"a", "b", "nap"}
    parked = await events_of(store, eid, "parked")
    # The event carries the divergence as parked (nulls included).
    assert [(e["token"], e["detail"]["reason"], e["detail"]["divergence"]) for e in parked] == [
        (2, "nondeterminism", divergence)]


@pytest.mark.parametrize("code", ["guarded", "swallow"])
async def test_workflow_code_that_catches_the_divergence_cannot_run_new_steps(
        store, pool, worker, code):
    eid = await admit(store, "ver-sdk-shape", f"shape-{code}")

    divergence = await run_v1_then_change(store, pool, eid, code)

    assert (divergence["position"], divergence["recorded"], divergence["asked"]) == (
        0, "a", "x"), divergence
    # The code saw the divergence (and, guarded, ran its finally:), but
    # every step it asked for after it was refused before its function ran.
    assert vf.SEEN[eid][0] == "Nondeterminism"
    if code == "guarded":
        assert vf.SEEN[eid] == ["Nondeterminism", "finally"]
    assert vf.ran(eid) == ["a", "b"], vf.ran(eid)
    assert set(await step_rows(pool, eid)) == {"a", "b", "nap"}
    assert (await store.history.get(eid))["outcome"] is None


# ------------------------------------------------------ no false divergence


async def test_gathered_steps_and_a_step_gathered_with_a_sleep_replay_across_deliveries(
        store, pool, worker):
    eid = await admit(store, "ver-sdk-gather", "gather")
    await wake(store, pool, eid, "nap1")
    await wake(store, pool, eid, "hs")
    await wake(store, pool, eid, "nap2")

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {"first": "a", "many": ["g0", "g1", "g2"],
                                            "paired": "h", "last": "z"}}
    # Each step function ran once, except that `h` may run again: its
    # sibling's sleep suspended the delivery before h's write (at least
    # once); either way it is recorded once and nothing diverged.
    assert [w for w in vf.ran(eid) if w != "h"] == ["a", "g0", "g1", "g2", "z"]
    assert vf.calls(eid, "h") >= 1
    assert await events_of(store, eid, "parked") == []
    assert len(await events_of(store, eid, "claimed")) == 4
    # The workflow's own asks are numbered; the gathered branches' are not.
    assert await positions(pool, eid) == {"a": 0, "g0": None, "g1": None, "g2": None,
                                          "nap1": 1, "h": None, "hs": None, "nap2": 2, "z": 3}


async def test_a_signal_wait_whose_timer_an_earlier_delivery_recorded_replays(
        store, pool, worker):
    eid = await admit(store, "ver-sdk-signal", "signal-timer")
    await suspended_at(store, pool, eid, "signal:go:timeout")
    assert "signal:go" not in await step_rows(pool, eid)

    assert (await store.signals.send_signal(eid, "go", {"n": 1}))[0] == "received"
    await wake(store, pool, eid, "nap")  # the second delivery consumed it, then slept
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {"payload": {"n": 1}}}
    assert vf.ran(eid) == ["a", "b", "c"]
    assert len(await events_of(store, eid, "claimed")) == 3
    assert await positions(pool, eid) == {"a": 0, "signal:go": 1, "signal:go:timeout": 2,
                                          "b": 3, "nap": 4, "c": 5}


async def test_a_signal_wait_that_timed_out_on_an_earlier_deliverys_timer_replays(
        store, pool, worker):
    eid = await admit(store, "ver-sdk-signal", "signal-timeout")
    await wake(store, pool, eid, "signal:go:timeout")  # no signal: the next delivery times out
    await wake(store, pool, eid, "nap")
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {"payload": "timed out"}}
    assert (await step_rows(pool, eid))["signal:go"]["error"]["name"] == "SignalTimeout"
    assert vf.ran(eid) == ["a", "b", "c"]
    assert await positions(pool, eid) == {"a": 0, "signal:go": 1, "signal:go:timeout": 2,
                                          "b": 3, "nap": 4, "c": 5}


async def test_a_step_added_past_the_recorded_history_is_a_compatible_change(
        store, pool, worker):
    eid = await admit(store, "ver-sdk-shape", "append")
    await suspended_at(store, pool, eid, "nap")
    vf.CODE["now"] = "append"

    await fast_forward_timer(pool, eid, "nap")
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": "done"}
    assert vf.ran(eid) == ["a", "b", "c", "y"]
    assert await positions(pool, eid) == {"a": 0, "b": 1, "nap": 2, "y": 3, "c": 4}


async def test_steps_recorded_before_positions_were_replay_fine(store, pool, worker):
    eid = await admit(store, "ver-sdk-shape", "legacy")
    await suspended_at(store, pool, eid, "nap")
    # As recorded before revision 0009: no positions.
    await pool.execute("UPDATE execution_steps SET position = NULL WHERE execution_id = $1", eid)

    await fast_forward_timer(pool, eid, "nap")
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": "done"}
    assert vf.ran(eid) == ["a", "b", "c"]
    assert (await positions(pool, eid))["c"] == 3
