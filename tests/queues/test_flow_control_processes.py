"""Flow control with real `fencepost worker` processes (tests/queues/flowflows.py):
the limits a queue declares hold across processes, measured on the database
clock.

Each execution's step records the `clock_timestamp()` interval it ran in,
inside its own fenced transaction, so every recorded interval lies within the
time its execution held a slot. Overlap is counted over those intervals;
starts (first claims) are the `claimed` events of token 1.
"""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from collections.abc import Iterable

import httpx
import pytest

from app.shared_settings import SHARED
from tests.support.api_process import ApiProcess
from tests.support.harness import DEFAULT_SETTINGS, LEASE_SECONDS, Harness

pytestmark = pytest.mark.acceptance

FLOWS = "tests.queues.flowflows"

# Leases long enough that no delivery of these tests loses its lease on a
# loaded machine: a lost lease frees its slot by design, which would be a
# different test (the last one here).
STEADY = {"FENCEPOST_LEASE_SECONDS": "10", "FENCEPOST_RENEW_SECONDS": "1"}


async def admit_all(h: Harness, workflow_id: str, queue: str, ids: list[str], *,
                    params: dict | None = None, keys: dict[str, str] | None = None,
                    priority: int = 0) -> None:
    """Admit `ids` to `queue` (a key from `keys` for each, if given), a few at a time."""
    async def one(eid: str) -> None:
        answer = await h.store.admissions.admit(
            workflow_id=workflow_id, params=params or {}, execution_id=eid, queue=queue,
            concurrency_key=(keys or {}).get(eid), priority=priority)
        assert getattr(answer, "status", None) == "admitted", answer

    for i in range(0, len(ids), 20):
        await asyncio.gather(*(one(eid) for eid in ids[i:i + 20]))


async def start_workers(h: Harness, names: Iterable[str], *, concurrency: int,
                        settings: dict[str, str]) -> list:
    workers = [h.spawn_worker(n, concurrency=concurrency, settings=settings) for n in names]
    for w in workers:
        await h.wait_registered(w)
    return workers


async def completed(h: Harness, ids: list[str], timeout: float) -> None:
    await h.wait_for(lambda: h.all_terminal(ids), timeout=timeout, interval=0.2,
                     what=f"{len(ids)} executions ended")
    statuses = await h.statuses(ids)
    assert set(statuses.values()) == {"completed"}, statuses


async def spans(h: Harness, ids: list[str]) -> dict[str, dict]:
    """Each execution's recorded step interval: {start, end, pid} (epoch seconds)."""
    rows = await h.pool.fetch(
        "SELECT execution_id, value FROM execution_steps "
        "WHERE execution_id = ANY($1::text[]) AND step_key = 'work'", ids)
    out = {r["execution_id"]: r["value"] for r in rows}
    assert sorted(out) == sorted(ids)
    return out


def most_at_once(intervals: Iterable[dict]) -> int:
    """The largest number of intervals that overlap at one instant; one that
    ends at the very instant another starts does not overlap it."""
    edges = sorted([(s["start"], 1) for s in intervals] + [(s["end"], -1) for s in intervals],
                   key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


async def takeovers(h: Harness, ids: list[str]) -> int:
    return int(await h.pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = ANY($1::text[]) "
        "AND kind = 'lease_expired'", ids))


async def claims(h: Harness, ids: list[str]) -> list[dict]:
    """`claimed` events of `ids`, in the order they were committed, with the
    claim's database time (epoch seconds) and owner."""
    rows = await h.pool.fetch(
        "SELECT execution_id, token, extract(epoch FROM at)::float8 AS at, "
        "detail->>'owner' AS owner FROM execution_events "
        "WHERE execution_id = ANY($1::text[]) AND kind = 'claimed' ORDER BY event_id", ids)
    return [dict(r) for r in rows]


@pytest.mark.timeout(240)
async def test_concurrency_3_holds_across_two_workers_and_is_reached(flows: Harness) -> None:
    h = flows
    ids = [f"q3-{i:03d}" for i in range(300)]
    await admit_all(h, "flow-q3", "q3", ids, params={"seconds": 0.05})
    workers = await start_workers(h, ["A", "B"], concurrency=16, settings=STEADY)

    await completed(h, ids, timeout=180)

    recorded = await spans(h, ids)
    most = most_at_once(recorded.values())
    by_pid = defaultdict(int)
    for s in recorded.values():
        by_pid[s["pid"]] += 1
    print(f"q3: most at once {most}; executions per worker {dict(by_pid)}")
    assert await takeovers(h, ids) == 0
    assert most == 3, most
    # Both processes ran the queue's work: the limit is held between them.
    assert set(by_pid) == {w.pid for w in workers}, by_pid


@pytest.mark.timeout(240)
async def test_per_key_1_never_runs_one_key_twice_and_runs_keys_in_parallel(
        flows: Harness) -> None:
    h = flows
    ids = [f"keyed-{i:03d}" for i in range(100)]
    keys = {eid: f"customer-{i % 20}" for i, eid in enumerate(ids)}
    await admit_all(h, "flow-keyed", "keyed", ids, params={"seconds": 0.1}, keys=keys)
    await start_workers(h, ["A", "B"], concurrency=16, settings=STEADY)

    await completed(h, ids, timeout=180)

    recorded = await spans(h, ids)
    per_key: dict[str, list[dict]] = defaultdict(list)
    for eid, s in recorded.items():
        per_key[keys[eid]].append(s)
    most_per_key = {key: most_at_once(s) for key, s in per_key.items()}
    across = most_at_once(recorded.values())
    print(f"keyed: most at once per key {max(most_per_key.values())}; across keys {across}")
    assert await takeovers(h, ids) == 0
    assert set(most_per_key.values()) == {1}, most_per_key
    assert across > 1, across


async def test_a_backlog_admitted_key_by_key_starts_every_key_at_once(flows: Harness) -> None:
    """Per-key 1, 20 keys of 5 executions admitted key after key: the first
    claim reaches only the first keys (their backlogs fill its scan), but
    the worker claims again at once rather than at its next poll, so every
    key starts within moments, not one key per poll interval."""
    h = flows
    ids = [f"burst-{k:02d}-{j}" for k in range(20) for j in range(5)]
    keys = {eid: f"customer-{eid[6:8]}" for eid in ids}
    await admit_all(h, "flow-keyed", "keyed", ids, params={"seconds": 2.0}, keys=keys)
    # The default poll interval: what a claim left behind waits for, unless
    # the worker claims again at once.
    await start_workers(h, ["A"], concurrency=32,
                        settings={**STEADY, "FENCEPOST_POLL_SECONDS": "1"})

    await completed(h, ids, timeout=120)

    recorded = await spans(h, ids)
    first = min(s["start"] for s in recorded.values())
    early = {keys[eid] for eid, s in recorded.items() if s["start"] < first + 1.5}
    print(f"burst: {len(early)} of 20 keys started within 1.5 s of the first")
    assert len(early) == 20, sorted(early)


@pytest.mark.timeout(180)
async def test_rate_limit_10_per_second_spreads_100_starts_over_about_10_seconds(
        flows: Harness) -> None:
    h = flows
    ids = [f"rated-{i:03d}" for i in range(100)]
    await admit_all(h, "flow-rated", "rated", ids)
    await start_workers(h, ["A", "B"], concurrency=16, settings=STEADY)

    await completed(h, ids, timeout=120)

    starts = sorted(c["at"] for c in await claims(h, ids) if c["token"] == 1)
    assert len(starts) == 100
    # Every 1-second window [t, t + 1) from each start holds at most 10 starts.
    fullest = max(sum(1 for u in starts if t <= u < t + 1.0) for t in starts)
    end = await h.pool.fetchval(
        "SELECT extract(epoch FROM max(at))::float8 FROM execution_events "
        "WHERE execution_id = ANY($1::text[]) AND kind = 'acknowledged'", ids)
    batch = end - starts[0]
    print(f"rated: fullest 1 s window {fullest} starts; first start to last end {batch:.2f} s; "
          f"first to last start {starts[-1] - starts[0]:.2f} s")
    assert fullest == 10, fullest
    # 100 starts at 10 a second: the 10th batch of 10 starts 9 s after the first.
    assert starts[-1] - starts[0] >= 8.9
    assert batch < 20, batch


@pytest.mark.timeout(120)
async def test_with_one_slot_a_later_priority_minus_1_runs_before_earlier_priority_0(
        flows: Harness, database_url: str) -> None:
    """Admitted through POST /v1/executions of a real API process, which puts
    each execution on its workflow's queue."""
    h = flows
    api = ApiProcess(database_url, h.log_dir, args=("--workflows", FLOWS), env={
        "FENCEPOST_AUTH": "disabled",
        # Settings every process shares must agree with the workers'.
        **{k: v for k, v in {**DEFAULT_SETTINGS, **STEADY}.items() if k in SHARED.values()}})
    try:
        await api.wait_ready()
        await start_workers(h, ["A"], concurrency=8, settings=STEADY)
        async with httpx.AsyncClient(base_url=api.base, timeout=30) as c:
            async def post(eid: str, seconds: float, **extra: int) -> None:
                r = await c.post("/v1/executions", json={
                    "workflowId": "flow-one", "executionId": eid,
                    "params": {"seconds": seconds}, **extra})
                assert r.status_code == 201, r.text

            # The slot is held while the others are admitted.
            await post("blocker", 3.0)
            await h.wait_for(lambda: h.has_status("blocker", "running"), timeout=20,
                             what="the blocker holds the slot")
            normal = [f"normal-{i}" for i in range(5)]
            for eid in normal:  # one by one: each due after the one before
                await post(eid, 0.05)
            await post("urgent", 0.05, priority=-1)
        assert await h.status("blocker") == "running", "the blocker ended before all were admitted"
    finally:
        api.stop()

    ids = ["blocker", *normal, "urgent"]
    await completed(h, ids, timeout=60)

    rows = await h.pool.fetch("SELECT execution_id, queue, priority FROM executions "
                              "WHERE execution_id = ANY($1::text[])", ids)
    assert {r["queue"] for r in rows} == {"one"}
    assert {r["execution_id"]: r["priority"] for r in rows}["urgent"] == -1
    order = [c["execution_id"] for c in await claims(h, ids)]
    assert order == ["blocker", "urgent", *normal], order


@pytest.mark.timeout(120)
async def test_a_sigkilled_workers_slot_is_free_again_when_its_lease_expires(
        flows: Harness) -> None:
    """Concurrency 1, lease 2 s. A holds the slot in a long step and is
    SIGKILLed; B, running all along, claims nothing of the queue until A's
    lease has expired, and then runs the next execution."""
    h = flows
    a = (await start_workers(h, ["A"], concurrency=2, settings={}))[0]
    await admit_all(h, "flow-one", "one", ["held"], params={"first_seconds": 60.0})
    await h.wait_for(lambda: h.has_status("held", "running"), timeout=20,
                     what="A holds the only slot")
    b = (await start_workers(h, ["B"], concurrency=2, settings={}))[0]
    await admit_all(h, "flow-one", "one", ["next"], params={"seconds": 0.05})
    await asyncio.sleep(1.0)  # B polls five times (every 0.2 s) meanwhile
    assert await h.status("next") == "admitted", "claimed while the only slot was held"

    a.signal(signal.SIGKILL)
    assert await a.wait_exit(5) == -signal.SIGKILL
    killed_at, expires_at = await h.pool.fetchrow(
        "SELECT extract(epoch FROM clock_timestamp())::float8, "
        "extract(epoch FROM lease_expires_at)::float8 FROM executions "
        "WHERE execution_id = 'held'")

    await completed(h, ["held", "next"], timeout=LEASE_SECONDS + 30)

    events = await claims(h, ["held", "next"])
    after = [c for c in events if c["owner"] == b.worker_id]
    first = after[0]
    print(f"sigkill: lease expired {expires_at - killed_at:.2f} s after the kill; "
          f"B claimed {first['execution_id']} {first['at'] - expires_at:.2f} s after expiry")
    assert [c["execution_id"] for c in events][:1] == ["held"]
    assert events[0]["owner"] == a.worker_id
    # Nothing of the queue was claimed while A's lease was live, and the
    # slot was taken again soon after it expired.
    assert first["at"] >= expires_at, (first, expires_at)
    assert first["at"] - expires_at < 5.0, (first, expires_at)
    assert sorted(c["execution_id"] for c in after) == ["held", "next"]
