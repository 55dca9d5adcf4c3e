"""`blockedBy` for a due execution its queue holds back (issue 15, Visible):
queue-paused, concurrency-limit {queue, key?, running, limit} and
rate-limited {queue, key?, until}, counted exactly as the claim counts (a
slot: a running execution with a live lease, a suspended one only when the
queue holds slots while suspended; a start: a first claim within the rate
period; no per-key limit without a key). Each case also checks the claim:
what reads held back is not claimed, what reads `due` is."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.claims import claim
from tests.support.clocks import expire_lease
from tests.support.responses import get_record

pytestmark = pytest.mark.timeout(60)

WF = "op-quick"


async def settings(store: ExecutionStore, queue: str, **values: Any) -> None:
    await store.queues.change(queue, values, actor="test")


async def live_worker(store: ExecutionStore) -> None:
    await store.workers.register_worker("w-live", host="t", pid=1, workflows=[WF],
                                        concurrency=8)


async def blocked(api: httpx.AsyncClient, eid: str) -> dict | None:
    return (await get_record(api, eid))["blockedBy"]


async def reasons(api: httpx.AsyncClient, *eids: str) -> dict[str, str | None]:
    out = {}
    for eid in eids:
        b = await blocked(api, eid)
        out[eid] = b["reason"] if b else None
    return out


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_a_paused_queue_holds_back_what_is_due_until_resumed(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await admit(store, WF, "p1", queue="reports")
    await settings(store, "reports", paused=True, concurrency=1)
    # Paused comes first, before the limits and before no-worker.
    await admit(store, "op-nobody-runs-this", "p2", queue="reports")
    assert await blocked(api, "p1") == {"reason": "queue-paused", "queue": "reports"}
    assert (await blocked(api, "p2"))["reason"] == "queue-paused"
    assert await claim(store) == {}

    await settings(store, "reports", paused=False)
    rec = await get_record(api, "p1")
    assert rec["blockedBy"] == {"reason": "due", "since": rec["dueAt"]}
    assert (await blocked(api, "p2"))["reason"] == "no-worker"
    assert list(await claim(store)) == ["p1"]


async def test_a_full_queue_then_a_full_key_and_an_expired_lease_frees_its_slot(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "payments", concurrency=2, per_key_concurrency=1)
    await admit(store, WF, "a1", queue="payments", concurrency_key="alice")
    await admit(store, WF, "b1", queue="payments", concurrency_key="bob")
    assert sorted(await claim(store)) == ["a1", "b1"]
    await admit(store, WF, "a2", queue="payments", concurrency_key="alice")
    await admit(store, WF, "c1", queue="payments", concurrency_key="carol")
    await admit(store, WF, "n1", queue="payments")  # no key
    # The queue's two slots are held: the queue's limit, for every one of them.
    for eid in ("a2", "c1", "n1"):
        assert await blocked(api, eid) == {"reason": "concurrency-limit", "queue": "payments",
                                           "running": 2, "limit": 2}, eid
    assert await claim(store) == {}

    # b1's lease expires: it holds no slot. Alice's one slot is still held;
    # carol and the keyless execution may run.
    await expire_lease(pool, "b1")
    assert await blocked(api, "a2") == {"reason": "concurrency-limit", "queue": "payments",
                                        "key": "alice", "running": 1, "limit": 1}
    assert await reasons(api, "c1", "n1") == {"c1": "due", "n1": "due"}
    # The listing's filter answers from the same rule.
    r = await api.get("/v1/executions", params={"blockedBy": "concurrency-limit"})
    assert r.status_code == 200, r.text
    items = r.json()["executions"]
    assert [i["executionId"] for i in items if i["executionId"] == "a2"] == ["a2"]
    assert all(i["blockedBy"]["reason"] == "concurrency-limit" for i in items), items
    # One of the queue's two slots is free: the claim fills it, with b1 (a
    # takeover, expired an hour ago: first in line), and the queue is full again.
    assert list(await claim(store)) == ["b1"]
    assert await reasons(api, "a2", "c1", "n1") == dict.fromkeys(("a2", "c1", "n1"),
                                                                 "concurrency-limit")


async def test_a_queue_holding_slots_while_suspended(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "held", concurrency=1, hold_while_suspended=True)
    await admit(store, WF, "s1", queue="held")
    [d] = (await claim(store)).values()
    await store.leases.acknowledge(d.lease, "suspended", waiting_on={"signal": "go"})
    await admit(store, WF, "s2", queue="held")
    # The suspended s1 holds the one slot; s2 waits for it.
    assert await blocked(api, "s2") == {"reason": "concurrency-limit", "queue": "held",
                                        "running": 1, "limit": 1}
    # s1 woken is due, and takes no new slot: it holds its own.
    await store.operator.request_wake("s1")
    assert (await blocked(api, "s1"))["reason"] == "due"
    assert list(await claim(store)) == ["s1"]

    # Without hold_while_suspended a suspended execution holds nothing.
    await settings(store, "loose", concurrency=1)
    await admit(store, WF, "l1", queue="loose")
    [d] = (await claim(store)).values()
    await store.leases.acknowledge(d.lease, "suspended", waiting_on={"signal": "go"})
    await admit(store, WF, "l2", queue="loose")
    assert (await blocked(api, "l2"))["reason"] == "due"


async def test_rate_limited_until_the_oldest_start_leaves_the_period(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "mail", rate_limit=2, rate_period=3600.0)
    for eid in ("m1", "m2", "m3"):
        await admit(store, WF, eid, queue="mail")
    assert sorted(await claim(store)) == ["m1", "m2"]
    [first] = await pool.fetch("SELECT min(started_at) AS at FROM queue_starts")
    b = await blocked(api, "m3")
    assert b == {"reason": "rate-limited", "queue": "mail", "until": b["until"]}, b
    assert at(b["until"]) == first["at"] + timedelta(hours=1)
    assert await claim(store) == {}

    # The starts leave the period: m3 is due.
    await pool.execute("UPDATE queue_starts SET started_at = now() - interval '2 hours'")
    assert (await blocked(api, "m3"))["reason"] == "due"


async def test_a_resumption_is_not_a_start(store: ExecutionStore,
                                          api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "mail", rate_limit=1, rate_period=3600.0)
    await admit(store, WF, "r1", queue="mail")
    [d] = (await claim(store)).values()
    await store.leases.acknowledge(d.lease, "suspended", waiting_on={"signal": "go"})
    await admit(store, WF, "r2", queue="mail")
    await store.operator.request_wake("r1")
    assert await reasons(api, "r1", "r2") == {"r1": "due", "r2": "rate-limited"}
    assert list(await claim(store)) == ["r1"]


async def test_a_rate_limit_per_key(store: ExecutionStore, pool: asyncpg.Pool,
                                    api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "api", rate_limit=1, rate_period=600.0, rate_per_key=True)
    await admit(store, WF, "k1", queue="api", concurrency_key="tenant-1")
    assert list(await claim(store)) == ["k1"]
    await admit(store, WF, "k2", queue="api", concurrency_key="tenant-1")
    await admit(store, WF, "k3", queue="api", concurrency_key="tenant-2")
    await admit(store, WF, "k4", queue="api")  # no key: no per-key limit
    started = await pool.fetchval("SELECT started_at FROM queue_starts "
                                  "WHERE concurrency_key = 'tenant-1'")
    b = await blocked(api, "k2")
    assert b == {"reason": "rate-limited", "queue": "api", "key": "tenant-1",
                 "until": b["until"]}, b
    assert at(b["until"]) == started + timedelta(minutes=10)
    assert await reasons(api, "k3", "k4") == {"k3": "due", "k4": "due"}
    assert sorted(await claim(store)) == ["k3", "k4"]


async def test_the_dashboard_listing_and_words_agree(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await live_worker(store)
    await settings(store, "payments", per_key_concurrency=1)
    await admit(store, WF, "d1", queue="payments", concurrency_key="alice")
    await claim(store)
    await admit(store, WF, "d2", queue="payments", concurrency_key="alice")
    rows, total = await store.dashboard.ui_list(
        live_workflows=await store.history.live_workflow_ids(60),
        blocked_by="concurrency-limit")
    assert (total, [r["execution_id"] for r in rows]) == (1, ["d2"])
    page = await api.get("/ui/executions/d2")
    assert page.status_code == 200, page.text
    assert "per-key concurrency limit" in page.text and "alice" in page.text
    listing = await api.get("/ui", params={"blockedBy": "concurrency-limit"})
    assert listing.status_code == 200, listing.text
    assert "/ui/executions/d2" in listing.text
    assert "/ui/executions/d1" not in listing.text


def _scans(plan: dict) -> list[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every node of a JSON plan."""
    found = [(plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


async def test_what_queues_hold_is_read_through_their_indexes(pool: asyncpg.Pool) -> None:
    """queue_state and key_state read executions through an index (the
    planner's choice of ix_executions_queue_held or the lease-expiry one) and
    queue_starts through ix_queue_starts_queue, never by a sequential scan,
    with 200,000 ended executions stored beside a few holding slots."""
    from app.blocked import QUEUE_STATE_CTES

    for name, values in (("qa", '{"concurrency": 5, "per_key_concurrency": 1}'),
                         ("qb", '{"rate_limit": 10, "rate_period": 60, "rate_per_key": true}')):
        await pool.execute("INSERT INTO queues (name, override) VALUES ($1, $2::jsonb)",
                           name, values)
    await pool.execute(
        """
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, outcome,
                                queue, concurrency_key, token, lease_owner, lease_expires_at)
        SELECT 'x' || g, fencepost_bucket('x' || g), 'wf', '{}'::jsonb,
               CASE WHEN g % 10000 = 0 THEN 'running' ELSE 'completed' END,
               CASE WHEN g % 10000 = 0 THEN NULL ELSE '{"result": null}'::jsonb END,
               CASE WHEN g % 2 = 0 THEN 'qa' ELSE 'qb' END, 'k' || (g % 100), 1,
               CASE WHEN g % 10000 = 0 THEN 'w' END,
               CASE WHEN g % 10000 = 0 THEN now() + interval '1 minute' END
        FROM generate_series(1, 200000) g
        """)
    await pool.execute(
        "INSERT INTO queue_starts (queue, concurrency_key, started_at) "
        "SELECT 'qb', 'k' || (g % 100), now() - make_interval(secs => g % 3600) "
        "FROM generate_series(1, 20000) g")
    await pool.execute("ANALYZE executions")
    await pool.execute("ANALYZE queue_starts")
    for relation in ("queue_state", "key_state"):
        [row] = await pool.fetch(
            f"EXPLAIN (FORMAT JSON) WITH {QUEUE_STATE_CTES} SELECT * FROM {relation}")
        raw = row[0]
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        scans = _scans(plan)
        read = [s for s in scans if s[1] in ("executions", "queue_starts")]
        assert read, (relation, scans)
        assert not [s for s in read if s[0] == "Seq Scan"], (relation, scans)
        assert {s[0] for s in read} <= {"Index Scan", "Index Only Scan",
                                        "Bitmap Heap Scan"}, (relation, scans)
        indexes = {s[2] for s in scans if s[2] is not None}
        assert "ix_queue_starts_queue" in indexes, (relation, scans)


async def test_an_expired_lease_its_queue_holds_back_says_so(
        store: ExecutionStore, api: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    """The claim takes over an expired lease only where its queue has room:
    in a paused queue, or a full one, the expired execution reads what holds
    it back, not `lease-expired` (which promises a takeover)."""
    await live_worker(store)
    await settings(store, "held", concurrency=2)
    await settings(store, "stopped", concurrency=2)
    for eid, queue in (("x1", "held"), ("x2", "held"), ("y1", "stopped")):
        await admit(store, WF, eid, queue=queue)
    assert sorted(await claim(store)) == ["x1", "x2", "y1"]
    await expire_lease(pool, "x1")
    await expire_lease(pool, "y1")
    await settings(store, "held", concurrency=1)  # x2's live lease fills it
    await settings(store, "stopped", paused=True)

    assert await reasons(api, "x1", "y1") == {"x1": "concurrency-limit", "y1": "queue-paused"}
    assert await blocked(api, "x1") == {"reason": "concurrency-limit", "queue": "held",
                                        "running": 1, "limit": 1}
    assert await claim(store) == {}  # as the claim agrees

    await settings(store, "held", concurrency=2)
    assert await reasons(api, "x1") == {"x1": "lease-expired"}
    assert list(await claim(store)) == ["x1"]
