"""A move racing a claim: either the claim commits first and the move loses
(nothing moved), or the move commits first and every later claim sees the
new version; never a delivery of a version nobody checked. Each
interleaving is forced once (StatementGate holds one statement mid-flight
with the row locked) and then both are shown to happen in free races.

And a delivery between the check and the move: the move is refused
(EXECUTION_RUNNING while it runs, EXECUTION_CHANGED once it ended), so a
history the check did not see is never moved."""

from __future__ import annotations

import asyncio

import pytest

from app.commands.errors import CommandError
from app.commands.versions import move_version, replay_check
from tests.support.claims import claim_one
from tests.support.races import Outcomes, StatementGate, until_waiting
from tests.versions import flows
from tests.versions.conftest import admit

LEASE = 30.0


async def claim_as(store, version: str) -> list:
    """One claim by a worker carrying `version` of vm-order."""
    return await store.leases.claim_due(100, LEASE, f"worker-v{version}", ["vm-order"], None,
                                        [version])


async def version_of(store, eid: str) -> str | None:
    return (await store.history.get(eid))["code_version"]


async def test_a_claim_holding_the_row_first_makes_the_move_lose(store, pool) -> None:
    await admit(store, "r1")
    seen = await store.versions.target("r1")
    when = "NEW.kind = 'claimed' AND NEW.execution_id = 'r1'"
    async with StatementGate(pool, "execution_events", when) as gate:
        claim = asyncio.create_task(claim_as(store, "1"))
        await gate.until_held(also=claim.done)
        move = asyncio.create_task(store.versions.move("r1", "2", by="t", check="passed",
                                                       seen=seen))
        await until_waiting(pool, 1, "row", what="the move waits for the claim's row lock",
                            also=move.done)
        assert not move.done()
        await gate.open()
        [delivery] = await claim
        answer, moved = await move
    assert delivery.code_version == "1" and delivery.lease.token == seen.token + 1
    assert (answer, moved) == ("running", None)
    assert await version_of(store, "r1") == "1"


async def test_a_move_holding_the_row_first_is_what_every_later_claim_sees(store, pool) -> None:
    await admit(store, "r2")
    seen = await store.versions.target("r2")
    when = "NEW.kind = 'version_moved' AND NEW.execution_id = 'r2'"
    async with StatementGate(pool, "execution_events", when) as gate:
        move = asyncio.create_task(store.versions.move("r2", "2", by="t", check="passed",
                                                       seen=seen))
        await gate.until_held(also=move.done)
        # The row is the move's until it commits: claims pass it by.
        assert await claim_as(store, "1") == []
        assert await claim_as(store, "2") == []
        await gate.open()
        answer, moved = await move
    assert answer == "moved" and moved is not None and moved.from_version == "1"
    assert await claim_as(store, "1") == []
    [delivery] = await claim_as(store, "2")
    assert delivery.code_version == "2" and delivery.lease.execution_id == "r2"


async def test_free_races_show_both_interleavings(store) -> None:
    outcomes = Outcomes("claim-first", "move-first")
    for i in outcomes.rounds(20, 200):
        eid = f"race-{i}"
        await admit(store, eid)
        seen = await store.versions.target(eid)
        move = store.versions.move(eid, "2", by="t", check="passed", seen=seen)
        claim = claim_as(store, "1")
        if i % 2:
            (answer, _), deliveries = await asyncio.gather(move, claim)
        else:
            deliveries, (answer, _) = await asyncio.gather(claim, move)
        mine = [d for d in deliveries if d.lease.execution_id == eid]
        where = f"round {i}: move {answer}, claim {[d.lease.execution_id for d in deliveries]}"
        if mine:
            # The claim won: it delivered the version it had; the move changed nothing.
            assert answer == "running" and mine[0].code_version == "1", where
            assert await version_of(store, eid) == "1", where
            outcomes.add("claim-first", where)
        else:
            # The move won: only a worker carrying the new version takes it.
            assert answer == "moved", where
            assert await claim_as(store, "1") == [], where
            [delivery] = await claim_as(store, "2")
            assert delivery.lease.execution_id == eid and delivery.code_version == "2", where
            outcomes.add("move-first", where)
    outcomes.assert_each("a version move racing a claim")


async def test_a_delivery_between_the_check_and_the_move_refuses_the_move(
        store, suspended) -> None:
    await suspended("r3", "r4")

    def checking_then(during):
        async def check(definition, history, workflows):
            report = await replay_check(definition, history, workflows)
            await during()
            return report
        return check

    async def claim_and_release() -> None:
        delivery = await claim_one(store, "r3", owner="worker-v1")
        await store.leases.release(delivery.lease)

    async def claim_and_keep() -> None:
        await claim_one(store, "r4", owner="worker-v1")

    await store.signals.send_signal("r3", "go", None)  # due: a worker may take it
    with pytest.raises(CommandError) as refused:
        await move_version(store, "r3", "2", by="t", workflows=flows.V2,
                           check=checking_then(claim_and_release))
    assert refused.value.code == "EXECUTION_CHANGED", refused.value.message
    await store.signals.send_signal("r4", "go", None)
    with pytest.raises(CommandError) as refused:
        await move_version(store, "r4", "2", by="t", workflows=flows.V2,
                           check=checking_then(claim_and_keep))
    assert refused.value.code == "EXECUTION_RUNNING", refused.value.message
    assert await version_of(store, "r3") == "1" and await version_of(store, "r4") == "1"
    # Checked again now, the move goes through for the one no delivery holds.
    done = await move_version(store, "r3", "2", by="t", workflows=flows.V2)
    assert done.check == "passed" and done.moved.to_version == "2"
