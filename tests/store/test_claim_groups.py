"""Claims shard group by shard group (what a claimer does on Citus), run here
on one Postgres with a placement forced on the pool and the claim's on-shard
function standing in: a group's claim takes only that group's executions, a claim visits the
groups until it has its limit, idle groups are skipped until their next due
time or a wake-up, and no group is starved by a busy one."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import BUCKETS, bucket_of
from app.store.on_shard import REGISTRY
from app.store.placement import ClaimRotation, Placement
from tests.support.admission import admit
from tests.support.clocks import backdate_due
from tests.support.stand_in_citus import stand_in_citus

# Two "shards": even buckets and odd buckets.
TWO = Placement((tuple(range(0, BUCKETS, 2)), tuple(range(1, BUCKETS, 2))))


def _ids_in(group: int, n: int, prefix: str) -> list[str]:
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        candidate = f"{prefix}-{i}"
        if bucket_of(candidate) % 2 == group:
            ids.append(candidate)
        i += 1
    return ids


def _force(store, placement: Placement) -> None:
    """Claims of `store` see `placement` (admissions go through `plain`, a
    store of its own on the same database: on one Postgres only the claim's
    function stands in for Citus)."""
    store.config.placement.placement = placement


@pytest.fixture(autouse=True)
async def _claims_on_shards(database_url):
    """The claim's on-shard function, on this Postgres standing in for the
    two "shards" of TWO."""
    await stand_in_citus(database_url, "b % 2", [REGISTRY["claim"]])


@pytest.fixture
def plain(pool) -> ExecutionStore:
    return ExecutionStore(pool)


async def test_a_claim_visits_groups_until_its_limit_and_starts_one_further_each_time(
        store, plain):
    _force(store, TWO)
    even, odd = _ids_in(0, 4, "e"), _ids_in(1, 4, "o")
    for eid in even + odd:
        await admit(plain, "wf", eid)
    first = [d.lease.execution_id for d in await store.leases.claim_due(3, 30, "w")]
    second = [d.lease.execution_id for d in await store.leases.claim_due(3, 30, "w")]
    # Each claim filled its limit from its first group; the second started at the other one.
    assert {bucket_of(i) % 2 for i in first} == {0}
    assert {bucket_of(i) % 2 for i in second} == {1}
    third = [d.lease.execution_id for d in await store.leases.claim_due(10, 30, "w")]
    assert sorted(first + second + third) == sorted(even + odd)


async def test_idle_groups_are_skipped_until_due_or_woken(store, plain, pool):
    _force(store, TWO)
    assert await store.leases.claim_due(10, 30, "w") == []
    # Both groups were found idle: an admission now is not looked for ...
    late = _ids_in(1, 1, "late")[0]
    await admit(plain, "wf", late)
    assert await store.leases.claim_due(10, 30, "w") == []
    # ... until a wake-up (a NOTIFY reached the worker) ...
    store.leases.wake_claims()
    assert [d.lease.execution_id for d in await store.leases.claim_due(10, 30, "w")] == [late]
    # ... or the group's next due time comes, as its last claim told.
    timer = _ids_in(0, 1, "timer")[0]
    await admit(plain, "wf", timer)
    await backdate_due(pool, timer, -0.3)  # due in 0.3 s
    store.leases.wake_claims()
    claimed = await store.leases.claim_due(10, 30, "w")
    assert claimed == [] and 0 < claimed.next_due_in <= 0.3
    await asyncio.sleep(0.35)
    assert [d.lease.execution_id for d in await store.leases.claim_due(10, 30, "w")] == [timer]


async def test_rotation_rechecks_an_idle_group_after_its_recheck_time():
    rotation = ClaimRotation(TWO.groups, recheck_seconds=0.05)
    assert rotation.order() == [0, 1]
    rotation.found(0, 0, None)
    rotation.found(1, 2, None)
    assert rotation.order() == [1]
    await asyncio.sleep(0.06)
    assert sorted(rotation.order()) == [0, 1]


def test_groups_are_visited_in_runs_of_one_node():
    """A claim visits the groups of one node in one transaction (no commit
    across nodes): the rotation's order, regrouped by node, nodes in the
    order the rotation first reaches them."""
    placement = Placement(((0,), (1,), (2,), (3,)), nodes=(10, 20, 10, 20))
    assert placement.by_node([1, 2, 3, 0]) == [[1, 3], [2, 0]]
    assert placement.by_node([2]) == [[2]]
    # Nodes unknown: one run.
    assert TWO.by_node([1, 0]) == [[1, 0]]


async def test_a_claim_with_a_placement_read_before_a_split_is_refused(store, plain):
    """A process that read the placement before a shard was split (here: one
    group holding the buckets of both stand-in shards) is refused with FPST1,
    nothing claimed, rather than claiming the half of the group on the shard
    of its first bucket and never looking at the other half; a claim with
    the placement as it is goes on working, call after call."""
    even, odd = _ids_in(0, 2, "split-e"), _ids_in(1, 2, "split-o")
    for eid in even + odd:
        await admit(plain, "wf", eid)
    _force(store, Placement((tuple(range(BUCKETS)),)))
    with pytest.raises(asyncpg.PostgresError, match="not all on the shard") as refused:
        await store.leases.claim_due(10, 30, "w")
    assert refused.value.sqlstate == "FPST1"
    assert await plain.pool.fetchval(
        "SELECT count(*) FROM executions WHERE status = 'running'") == 0
    _force(store, TWO)
    store.leases.wake_claims()
    first = await store.leases.claim_due(2, 30, "w")
    second = await store.leases.claim_due(10, 30, "w")
    assert sorted(d.lease.execution_id for d in [*first, *second]) == sorted(even + odd)
