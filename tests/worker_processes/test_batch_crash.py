"""A worker killed while its step writes are being group-committed: each
delivery's writes committed with its own token or not at all.

A real `fencepost worker` runs many executions at once, each writing its steps
one after another, so its step writes go to the database in batches of
several deliveries (one statement per batch; the batching shows in the
history: step_recorded events of several executions written by one
statement share the statement's transaction time). It is SIGKILLed in the
middle; a second worker then finishes everything. Timings from
harness.DEFAULT_SETTINGS (lease 2 s).
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict

import asyncpg
import pytest

from tests.support.harness import LEASE_SECONDS, Harness, steps_spec

pytestmark = pytest.mark.acceptance

EXECUTIONS = 96
KEYS = [f"s{n}" for n in range(8)]
TOTAL = EXECUTIONS * len(KEYS)


def pool_of(h: Harness) -> asyncpg.Pool:
    assert h.pool is not None, "the harness is open"
    return h.pool


async def recorded(h: Harness) -> list[dict]:
    return [dict(r) for r in await pool_of(h).fetch(
        "SELECT execution_id, at, token, detail ->> 'stepKey' AS step_key "
        "FROM execution_events WHERE kind = 'step_recorded' ORDER BY event_id")]


def statements(events: list[dict]) -> dict[object, set[str]]:
    """Executions whose steps each statement recorded, by transaction time."""
    by_time: dict[object, set[str]] = defaultdict(set)
    for e in events:
        by_time[e["at"]].add(e["execution_id"])
    return by_time


def batched(events: list[dict]) -> int:
    """How many statements recorded steps of more than one execution (events
    that share a transaction time)."""
    return sum(1 for ids in statements(events).values() if len(ids) > 1)


@pytest.mark.timeout(120)
async def test_sigkill_while_step_writes_are_batched_every_write_commits_with_its_token_or_not_at_all(
        harness: Harness) -> None:
    h = harness
    ids = [f"acc-batch-{i:03d}" for i in range(EXECUTIONS)]
    for eid in ids:
        await h.admit(eid, steps_spec(*KEYS, seconds=0.002))
    a = await h.start_worker("A", concurrency=32)

    async def midway() -> list[dict] | None:
        events = await recorded(h)
        return events if len(events) >= TOTAL // 4 and batched(events) >= 3 else None

    await h.wait_for(midway, timeout=60, interval=0.02,
                     what="A a quarter of the way, its step writes batched")
    a.signal(signal.SIGKILL)
    assert await a.wait_exit(5) == -signal.SIGKILL
    killed_at = await pool_of(h).fetchval("SELECT now()")

    # What A left: per execution, a prefix of its steps (a delivery's writes in
    # its order), each written with A's token, and not everything.
    at_kill = {eid: {s["step_key"]: s for s in await h.steps(eid)} for eid in ids}
    assert 0 < sum(map(len, at_kill.values())) < TOTAL
    for eid, steps in at_kill.items():
        assert sorted(steps) == KEYS[:len(steps)], (eid, sorted(steps))
        assert all(s["token"] == 1 and s["value"]["pid"] == a.pid for s in steps.values()), steps
    unfinished = [eid for eid in ids if not await h.has_status(eid, "completed")]
    assert unfinished, "A was killed before finishing everything"

    b = await h.start_worker("B", concurrency=32)

    async def all_completed() -> bool:
        return await pool_of(h).fetchval(
            "SELECT count(*) FROM executions WHERE status = 'completed'") == EXECUTIONS

    await h.wait_for(all_completed, timeout=LEASE_SECONDS + 60, what="B completes everything")

    claims = {(r["execution_id"], r["token"]): r["owner"] for r in await pool_of(h).fetch(
        "SELECT execution_id, token, detail ->> 'owner' AS owner FROM execution_events "
        "WHERE kind = 'claimed'")}
    owner_of_pid = {a.pid: a.worker_id, b.pid: b.worker_id}
    for eid in ids:
        events = await h.assert_recorded_once(eid, KEYS)
        steps = {s["step_key"]: s for s in await h.steps(eid)}
        # Every step row carries the token of a claim that existed, held by
        # the worker whose step function produced the value.
        for key, s in steps.items():
            assert claims.get((eid, s["token"])) == owner_of_pid[s["value"]["pid"]], (eid, key, s)
        # A's steps stand as A wrote them; nothing was written twice.
        for key, s in at_kill[eid].items():
            assert steps[key] == s, (eid, key)
        step_events = [(e["detail"]["stepKey"], e["token"]) for e in events
                       if e["kind"] == "step_recorded"]
        assert step_events == [(k, steps[k]["token"]) for k in KEYS], (eid, step_events)
        completions = [e for e in events if e["kind"] == "acknowledged"
                       and (e["detail"] or {}).get("status") == "completed"]
        assert len(completions) == 1, (eid, completions)
        rec = await h.record(eid)
        assert rec["status"] == "completed"
        assert {k: v["pid"] for k, v in rec["outcome"]["result"].items()} == {
            k: s["value"]["pid"] for k, s in steps.items()}, eid

    # B's writes were batched too (several executions per statement).
    events = await recorded(h)
    for who, mine in (("A", [e for e in events if e["token"] == 1 and e["at"] <= killed_at]),
                      ("B", [e for e in events if e["at"] > killed_at])):
        print(f"\n{who}: {len(mine)} steps recorded by {len(statements(mine))} statements, "
              f"{batched(mine)} of them for several executions")
    assert batched([e for e in events if e["at"] > killed_at]) >= 1
    assert Counter(e["execution_id"] for e in events) == Counter(
        {eid: len(KEYS) for eid in ids})
    assert b.alive()
