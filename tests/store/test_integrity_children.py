"""Issue 10, item 8: children are fenced and unique.

`start_child` carries the parent's token predicate (token current, status
running) in the statement that inserts the child, and the unique index
`ux_executions_parent_step` allows one child per (parent, step key)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ChildExecution, ExecutionStore, Lease, LeaseLost
from tests.support.admission import admit
from tests.support.waiting import wait_until


async def claim(store: ExecutionStore, workflow_id: str, owner: str) -> Lease:
    deliveries = await store.leases.claim_due(1, 30.0, owner, [workflow_id])
    assert len(deliveries) == 1, f"nothing of {workflow_id} to claim"
    return deliveries[0].lease


async def children(pool: asyncpg.Pool, parent: str) -> list[tuple[str, str | None]]:
    rows = await pool.fetch(
        "SELECT execution_id, parent_step_key FROM executions "
        "WHERE parent_execution_id = $1 ORDER BY execution_id", parent)
    return [(r["execution_id"], r["parent_step_key"]) for r in rows]


async def event_count(pool: asyncpg.Pool, execution_id: str, kind: str) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = $1 AND kind = $2",
        execution_id, kind)


async def lock_waiters(pool: asyncpg.Pool) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'")


async def wait_for_lock_waiters(pool: asyncpg.Pool, n: int, tasks: list[asyncio.Task]) -> None:
    async def waiting() -> bool:
        for t in tasks:
            if t.done():  # finished without waiting: surface its answer
                t.result()
        return await lock_waiters(pool) >= n

    await wait_until(waiting, timeout=10, interval=0.01,
                     what=f"{n} sessions waiting for a lock")


async def test_a_stale_parent_holder_cannot_start_a_child_after_a_newer_claim(
        store: ExecutionStore, pool: asyncpg.Pool, clock):
    await admit(store, "fence-parent", "fp")
    stale = await claim(store, "fence-parent", "holder-A")
    await clock.expire_lease("fp")
    current = await claim(store, "fence-parent", "holder-B")
    assert current.token == stale.token + 1

    with pytest.raises(LeaseLost):
        await store.compose.start_child(stale, "c", workflow_id="fence-child", params={},
                                child_id="fp~stale")

    assert await children(pool, "fp") == []
    assert await store.history.get("fp~stale") is None
    assert await event_count(pool, "fp", "child_started") == 0
    # The current holder starts it, once.
    assert await store.compose.start_child(current, "c", workflow_id="fence-child", params={},
                                   child_id="fp~c") == ("started", ChildExecution("fp~c"))
    assert await children(pool, "fp") == [("fp~c", "c")]


async def test_a_stale_holder_whose_lease_lapsed_unclaimed_may_still_start_its_child(
        store: ExecutionStore, pool: asyncpg.Pool, clock):
    """The predicate is the one every fenced write uses (token current, status
    running): an expired lease nobody has taken over yet is still current."""
    await admit(store, "fence-parent", "fq")
    lease = await claim(store, "fence-parent", "holder-A")
    await clock.expire_lease("fq")
    assert (await store.compose.start_child(lease, "c", workflow_id="fence-child", params={},
                                    child_id="fq~c"))[0] == "started"


async def test_concurrent_start_child_for_one_step_with_different_ids_makes_one_child(
        store: ExecutionStore, pool: asyncpg.Pool, open_pool):
    """Two start_child calls for the same (parent, step key), each with its own
    caller-chosen child ID. Each interleaving is forced:
      - concurrent: a third session holds the parent row FOR UPDATE until both
        calls wait behind it, so both read the table before either inserted
        and both reach the insert (the unique index decides);
      - sequential: the second starts after the first committed.
    Either way one child exists and both answers name it."""
    other_pools = [await open_pool(), await open_pool()]
    outcomes = {"concurrent": 0, "sequential": 0}
    winners = {"x": 0, "y": 0}
    for i, mode in enumerate(["concurrent"] * 6 + ["sequential"] * 2):
        parent = await admit(store, "race-parent", f"rp-{i}")
        lease = await claim(store, "race-parent", "holder")
        ids = {"x": f"{parent}~x", "y": f"{parent}~y"}

        async def start(which: str, p: asyncpg.Pool, lease=lease, ids=ids):
            return await ExecutionStore(p).compose.start_child(
                lease, "step", workflow_id="race-child", params={"by": which},
                child_id=ids[which])

        if mode == "concurrent":
            async with pool.acquire() as barrier:
                tx = barrier.transaction()
                await tx.start()
                await barrier.execute(
                    "SELECT 1 FROM executions WHERE execution_id = $1 FOR UPDATE", parent)
                tasks = [asyncio.create_task(start("x", other_pools[0])),
                         asyncio.create_task(start("y", other_pools[1]))]
                await wait_for_lock_waiters(pool, 2, tasks)
                await tx.commit()
            answers = dict(zip("xy", await asyncio.gather(*tasks), strict=True))
        else:
            answers = {"x": await start("x", other_pools[0])}
            answers["y"] = await start("y", other_pools[1])

        kinds = sorted(kind for kind, _ in answers.values())
        assert kinds == ["existing", "started"], (mode, answers)
        winner = next(w for w, (kind, _) in answers.items() if kind == "started")
        winners[winner] += 1
        assert {d.execution_id for _, d in answers.values()} == {ids[winner]}, answers
        assert await children(pool, parent) == [(ids[winner], "step")]
        assert await event_count(pool, parent, "child_started") == 1
        outcomes[mode] += 1
    assert outcomes == {"concurrent": 6, "sequential": 2}
    print(f"winners of the forced races: {winners}")


async def test_the_unique_index_refuses_a_second_child_for_a_step(
        store: ExecutionStore, pool: asyncpg.Pool):
    await admit(store, "race-parent", "ui")
    lease = await claim(store, "race-parent", "holder")
    await store.compose.start_child(lease, "s", workflow_id="race-child", params={}, child_id="ui~1")
    with pytest.raises(asyncpg.UniqueViolationError):
        await pool.execute(
            "INSERT INTO executions (execution_id, bucket, workflow_id, params, "
            "parent_execution_id, parent_step_key) "
            "VALUES ('ui~2', fencepost_bucket('ui~2'), 'race-child', '{}'::jsonb, 'ui', 's')")
