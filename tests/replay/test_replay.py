"""The replay check (app/replay.py) against histories real workers recorded:
compatible changes pass; an inserted, a removed and a reordered step, and code
that returns before recorded steps, each report the first divergence
(position, recorded, asked) - and no step function, effect, transaction or
child start runs while the code replays."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pydantic import BaseModel

from app.replay import HistoryFormatError, replay
from tests.replay import variants
from tests.replay.conftest import WORKFLOWS, definition
from tests.replay.steps import reserve, wrap
from tests.support.admission import admit
from tests.support.waiting import wait_until

RECORDED = ["reserve", "charge", "book", "kid", "kid-done", "nap"]


async def test_the_export_holds_every_ask_in_order(recorded) -> None:
    history = await recorded("o-1", n=3)
    assert history["format"] == "fencepost-history/1"
    assert (history["executionId"], history["workflowId"], history["status"]) == \
        ("o-1", "rp-order", "suspended")
    assert history["params"] == {"n": 3} and history["context"] == {}
    assert [s["key"] for s in history["steps"]] == RECORDED
    assert [s["position"] for s in history["steps"]] == list(range(6))
    assert [s["functionName"] for s in history["steps"]] == [
        "reserve", "charge", "book", "child:rp-child", "child-wait", "sleep"]
    assert history["steps"][0]["value"] == 30 and history["steps"][0]["status"] == "completed"
    assert all(s["recordedAt"] and s["attempts"] == 1 for s in history["steps"])


async def test_the_same_code_replays_to_the_frontier(recorded, armed) -> None:
    history = await recorded("o-1")
    report = await replay(definition(variants.recorded), history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed, report.divergence) == \
        (True, "frontier", 6, None)
    assert report.to_json() == {"executionId": "o-1", "workflowId": "rp-order", "ok": True,
                                "replayed": 6, "end": "frontier", "divergence": None}
    assert armed == []


@pytest.mark.parametrize("code", [variants.appended, variants.patched],
                         ids=["step-appended", "patch-on-old-history"])
async def test_a_compatible_change_passes(recorded, armed, code) -> None:
    history = await recorded("o-1")
    report = await replay(definition(code), history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed, report.divergence) == \
        (True, "frontier", 6, None)
    assert armed == []


@pytest.mark.parametrize(("code", "position", "was", "asked"), [
    (variants.inserted, 1, "charge", "fraud"),
    (variants.removed, 2, "book", "kid"),
    (variants.reordered, 1, "charge", "book"),
], ids=["inserted", "removed", "reordered"])
async def test_a_changed_order_reports_the_first_divergence(recorded, armed, code, position,
                                                              was, asked) -> None:
    history = await recorded("o-1")
    report = await replay(definition(code), history, WORKFLOWS)
    assert not report.ok
    assert report.replayed == position
    found = report.divergence
    assert (found["position"], found["recorded"], found["asked"]) == (position, was, asked)
    assert f"at position {position} the history recorded step {was!r}" in found["message"]
    assert armed == []


async def test_a_recorded_step_no_longer_reached_is_a_divergence(recorded, armed) -> None:
    history = await recorded("o-1")
    report = await replay(definition(variants.returns_early), history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed) == (False, "returned", 3)
    found = report.divergence
    assert (found["position"], found["recorded"], found["asked"]) == (3, "kid", None)
    assert "['kid', 'kid-done', 'nap'] were not reached" in found["message"]
    assert armed == []


async def test_a_swallowed_divergence_still_stands(recorded, armed) -> None:
    history = await recorded("o-1")
    report = await replay(definition(variants.swallows), history, WORKFLOWS)
    assert not report.ok and report.end == "returned"
    assert (report.divergence["position"], report.divergence["asked"]) == (1, "fraud")
    assert armed == []


async def test_patched_code_replays_its_own_decision_and_old_code_does_not_fit(
        recorded, armed) -> None:
    # Recorded under the patched code: the decision (patch#fraud-check) and
    # the fraud step are in the history.
    history = await recorded("o-new", code=variants.patched)
    keys = [s["key"] for s in history["steps"]]
    assert keys[:3] == ["reserve", "patch#fraud-check", "fraud"], keys
    report = await replay(definition(variants.patched), history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed) == (True, "frontier", 8)
    # Rolling the patch back does not fit this history.
    report = await replay(definition(variants.recorded), history, WORKFLOWS)
    assert not report.ok
    assert (report.divergence["position"], report.divergence["recorded"],
            report.divergence["asked"]) == (1, "patch#fraud-check", "charge")
    assert armed == []


async def test_a_completed_execution_replays_to_its_return(store, workers) -> None:
    await workers.start()
    await admit(store, "rp-short", "s-1")

    async def completed() -> bool:
        return (await store.history.get("s-1"))["status"] == "completed"

    await wait_until(completed, timeout=20, what="s-1 completed")
    history = await store.exports.export("s-1")
    report = await replay(WORKFLOWS["rp-short"], history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed) == (True, "returned", 2)


async def test_params_that_no_longer_parse_are_reported(recorded) -> None:
    class Strict(BaseModel):
        n: str

    history = await recorded("o-1")
    strict = dataclasses.replace(definition(variants.recorded), params_model=Strict)
    report = await replay(strict, history)
    assert not report.ok and report.end == "raised" and report.replayed == 0
    assert "params no longer match" in report.divergence["message"]


async def test_another_workflow_or_format_is_refused(recorded) -> None:
    history = await recorded("o-1")
    with pytest.raises(ValueError, match="is of workflow 'rp-order', not 'rp-short'"):
        await replay(WORKFLOWS["rp-short"], history)
    with pytest.raises(HistoryFormatError, match="fencepost-history/1"):
        await replay(definition(variants.recorded), {**history, "format": "other/9"})


async def test_an_unknown_execution_exports_nothing(store) -> None:
    assert await store.exports.export("nobody") is None


async def test_signal_waits_replay_and_a_pending_signal_is_not_consumed(store, pool, workers,
                                                                        armed) -> None:
    await workers.start()
    await admit(store, "rp-signal", "g-1")
    assert (await store.signals.send_signal("g-1", "go", {"a": 1}))[0] == "received"

    async def waiting_again() -> bool:
        record = await store.history.get("g-1")
        return record["status"] == "suspended" and \
            (record["waiting_on"] or {}).get("signal") == "again"

    await wait_until(waiting_again, timeout=20, what="g-1 waits for 'again'")
    await workers.stop_all()
    history = await store.exports.export("g-1")
    # The wait for "again" suspended with nothing recorded at its position;
    # its timeout timer is recorded after it.
    assert [(s["key"], s["position"]) for s in history["steps"]] == [
        ("signal:go", 0), ("signal:again:timeout", 2)]
    assert (await store.signals.send_signal("g-1", "again", 2))[0] == "received"
    report = await replay(WORKFLOWS["rp-signal"], history, WORKFLOWS)
    # Replayed: the first wait's signal and the second wait's recorded timer
    # (taken with its wait, at its position), then the frontier.
    assert (report.ok, report.end, report.replayed) == (True, "frontier", 2)
    # The replay consumed nothing: the pending signal is still there.
    assert [s["key"] for s in (await store.exports.export("g-1"))["steps"]] == [
        "signal:go", "signal:again:timeout"]
    assert await pool.fetchval(
        "SELECT count(*) FROM signals WHERE execution_id = 'g-1' AND name = 'again' "
        "AND consumed_at IS NULL") == 1
    assert armed == []


async def test_code_that_raises_before_recorded_steps_does_not_fit(recorded, armed) -> None:
    async def raises_early(ctx, params):
        await ctx.step("reserve", reserve, params.get("n", 1))
        raise RuntimeError("a new validation")

    history = await recorded("o-1")
    report = await replay(definition(raises_early), history, WORKFLOWS)
    assert (report.ok, report.end, report.replayed) == (False, "raised", 1)
    found = report.divergence
    assert (found["position"], found["recorded"], found["asked"]) == (1, "charge", None)
    assert "the code raised RuntimeError without asking for 'charge'" in found["message"]
    assert armed == []


async def test_concurrent_branches_replay_and_a_new_branch_is_the_frontier(store, workers,
                                                                           armed) -> None:
    await workers.start()
    await admit(store, "rp-gather", "c-1")

    async def napping() -> bool:
        record = await store.history.get("c-1")
        return record["status"] == "suspended" and (record["waiting_on"] or {}).get("sleep")

    await wait_until(napping, timeout=20, what="c-1 sleeps")
    await workers.stop_all()
    history = await store.exports.export("c-1")
    # Branches' asks have no position; the sleep after the join is position 0.
    assert [(s["key"], s["position"]) for s in history["steps"]][0] == ("nap", 0)
    assert sorted(s["key"] for s in history["steps"][1:]) == ["left", "right"]
    report = await replay(WORKFLOWS["rp-gather"], history, WORKFLOWS)
    # A recorded sleep is due in a replay: the code goes on past it (and returns).
    assert (report.ok, report.end, report.replayed) == (True, "returned", 3)

    async def third_branch(ctx, params):
        await asyncio.gather(ctx.step("left", wrap), ctx.step("right", wrap),
                             ctx.step("middle", wrap))
        await ctx.sleep("nap", 3600)

    changed = dataclasses.replace(WORKFLOWS["rp-gather"], fn=third_branch)
    report = await replay(changed, history, WORKFLOWS)
    assert (report.ok, report.end) == (True, "frontier")
    assert armed == []
