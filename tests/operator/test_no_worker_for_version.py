"""Issue 16 item 1, visible: an execution admitted under a code version no
live worker carries reads blockedBy no-worker-for-version (in the API, the
dashboard's filter and words, and the waiting gauge), exactly when the
claim would not take it; and a nondeterminism park shows its divergence."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from app.blocked import blocked_by
from app.store import ExecutionStore
from app.ui import views
from tests.support.admission import admit
from tests.support.responses import get_record

pytestmark = pytest.mark.timeout(60)


async def _reasons(store: ExecutionStore, api: httpx.AsyncClient,
                   eids: list[str]) -> dict[str, str]:
    """Each execution's reason, once all of the API, the dashboard's SQL and
    words and the Python rule agree on it."""
    live = await store.history.live_workflow_ids(60)
    rows, _ = await store.dashboard.ui_list(live_workflows=live, limit=100)
    listed = {r["execution_id"]: r for r in rows}
    out = {}
    for eid in eids:
        answer = (await get_record(api, eid))["blockedBy"]
        row = listed[eid]
        seen = {"api": answer["reason"] if answer else "none",
                "sql": row["blocked_reason"],
                "python": (blocked_by(row, live) or {"reason": "none"})["reason"],
                "words": views.explain_blocked(blocked_by(row, live), row).reason}
        assert len(set(seen.values())) == 1, (eid, seen)
        out[eid] = seen["api"]
    return out


async def test_the_version_a_live_worker_carries_decides_as_the_claim_does(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    # w-new carries v2 of op-a; w-old carries op-a unversioned (registered
    # with no versions, as before they were recorded); op-b runs at v1 on w-new;
    # w-gone carried v1 of op-a but has stopped.
    await store.workers.register_worker("w-new", host="t", pid=1, workflows=["op-a", "op-b"],
                                        concurrency=1, versions={"op-a": "v2", "op-b": "v1"})
    await store.workers.register_worker("w-old", host="t", pid=2, workflows=["op-a"],
                                        concurrency=1)
    await store.workers.register_worker("w-gone", host="t", pid=3, workflows=["op-a"],
                                        concurrency=1, versions={"op-a": "v1"})
    await store.workers.worker_stopped("w-gone")
    await admit(store, "op-a", "a-v1", code_version="v1")
    await admit(store, "op-a", "a-v2", code_version="v2")
    await admit(store, "op-a", "a-unversioned")
    await admit(store, "op-b", "b-v2", code_version="v2")
    await admit(store, "op-nowhere", "n-v1", code_version="v1")
    eids = ["a-v1", "a-v2", "a-unversioned", "b-v2", "n-v1"]
    assert await _reasons(store, api, eids) == {
        "a-v1": "no-worker-for-version", "a-v2": "due", "a-unversioned": "due",
        "b-v2": "no-worker-for-version", "n-v1": "no-worker"}
    assert (await get_record(api, "a-v1"))["blockedBy"] == {
        "reason": "no-worker-for-version", "workflowId": "op-a", "version": "v1",
        "since": (await get_record(api, "a-v1"))["dueAt"]}
    # The filter finds exactly those.
    live = await store.history.live_workflow_ids(60)
    found, n = await store.dashboard.ui_list(live_workflows=live,
                                             blocked_by="no-worker-for-version")
    assert sorted(r["execution_id"] for r in found) == ["a-v1", "b-v2"] and n == 2
    listing = await api.get("/v1/executions", params={"blockedBy": "no-worker-for-version"})
    assert sorted(e["executionId"] for e in listing.json()["executions"]) == ["a-v1", "b-v2"]

    # What each live worker claims, with what it carries: all the due ones,
    # none of those that read no-worker-for-version.
    claimed = {d.lease.execution_id for d in await store.leases.claim_due(
        10, 30, "w-new", ["op-a", "op-b"], versions=["v2", "v1"])}
    claimed |= {d.lease.execution_id for d in await store.leases.claim_due(
        10, 30, "w-old", ["op-a"], versions=[None])}
    assert claimed == {"a-v2", "a-unversioned"}

    # The gauge counts them by the same rule, per workflow.
    waiting = (await store.workers.metrics_snapshot(live_within_seconds=60))["waiting"]
    assert {k: v for k, v in waiting.items() if k[0] == "no-worker-for-version"} == {
        ("no-worker-for-version", "op-a"): 1, ("no-worker-for-version", "op-b"): 1}
    text = (await api.get("/metrics")).text
    assert ('fencepost_waiting_executions{reason="no-worker-for-version",workflow="op-a"} 1.0'
            in text), text

    # A worker carrying v1 of op-a starts: a-v1 is due, and claimed.
    await store.workers.register_worker("w-v1", host="t", pid=4, workflows=["op-a"],
                                        concurrency=1, versions={"op-a": "v1"})
    assert (await _reasons(store, api, ["a-v1"])) == {"a-v1": "due"}
    [d] = await store.leases.claim_due(10, 30, "w-v1", ["op-a"], versions=["v1"])
    assert d.lease.execution_id == "a-v1"


async def test_an_expired_lease_only_another_version_could_take_over_says_so(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await store.workers.register_worker("w-v1", host="t", pid=1, workflows=["op-a"],
                                        concurrency=1, versions={"op-a": "v1"})
    await admit(store, "op-a", "x-v1", code_version="v1")
    [d] = await store.leases.claim_due(1, 30, "w-v1", ["op-a"], versions=["v1"])
    await store.workers.worker_stopped("w-v1")
    await store.workers.register_worker("w-v2", host="t", pid=2, workflows=["op-a"],
                                        concurrency=1, versions={"op-a": "v2"})
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = 'x-v1'")
    assert await _reasons(store, api, ["x-v1"]) == {"x-v1": "no-worker-for-version"}
    rec = await get_record(api, "x-v1")
    assert rec["blockedBy"] == {"reason": "no-worker-for-version", "workflowId": "op-a",
                                "version": "v1", "since": rec["lastUnacknowledgedAt"]}
    # The v2 worker does not take it over, even once the redelivery delay passed.
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                       "WHERE execution_id = 'x-v1'")
    assert await store.leases.claim_due(1, 30, "w-v2", ["op-a"], versions=["v2"]) == []
    # No worker of op-a at all: an expired lease reads lease-expired, as before.
    await store.workers.worker_stopped("w-v2")
    assert await _reasons(store, api, ["x-v1"]) == {"x-v1": "lease-expired"}
    assert d.lease.execution_id == "x-v1"


async def test_a_nondeterminism_park_shows_where_code_and_history_disagree(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await admit(store, "op-a", "nd-1", code_version="v3")
    [d] = await store.leases.claim_due(1, 30, "w", ["op-a"])
    detail = {"position": 2, "recorded": "charge", "asked": "refund",
              "message": "the code asked for 'refund' where the history recorded 'charge'"}
    assert await store.effects.park(d.lease, "nondeterminism", "refund", detail) == "parked"

    rec = await get_record(api, "nd-1")
    assert rec["parked"] == {"reason": "nondeterminism", "step": "refund", "divergence": detail}
    assert rec["blockedBy"] == {"reason": "parked", "parkedReason": "nondeterminism",
                                "step": "refund"}
    page = await api.get("/ui/executions/nd-1")
    assert page.status_code == 200, page.text
    for shown in ("id=\"divergence\"", "ask 2", "<code>charge</code>", "<code>refund</code>",
                  "the code asked for &#39;refund&#39; where the history recorded &#39;charge&#39;",
                  "its code no longer fits its history", "<code>v3</code>"):
        assert shown in page.text, shown
    listing = await api.get("/ui", params={"blockedBy": "parked"})
    assert "/ui/executions/nd-1" in listing.text
    assert "parked: code diverged at “refund”" in listing.text
    # The parked gauge has the reason, at 0 when none is parked for it.
    assert (await store.workers.metrics_snapshot())["parked"] == {"nondeterminism": 1}
    text = (await api.get("/metrics")).text
    assert 'fencepost_parked_executions{reason="nondeterminism"} 1.0' in text
    assert 'fencepost_parked_executions{reason="poison"} 0.0' in text


async def test_an_unversioned_execution_page_says_so(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await admit(store, "op-a", "plain-1")
    page = await api.get("/ui/executions/plain-1")
    assert page.status_code == 200, page.text
    assert "none (unversioned" in page.text


async def test_the_queues_page_lists_what_only_another_version_could_run(
        store: ExecutionStore) -> None:
    # The Queues page's waiting list shows the due executions the claim would
    # not take and why: one no live worker carries the version of included.
    await store.workers.register_worker("w-v2", host="t", pid=1, workflows=["op-q"],
                                        concurrency=1, versions={"op-q": "v2"})
    await admit(store, "op-q", "q-v1", code_version="v1")
    await admit(store, "op-q", "q-v2", code_version="v2")
    live = await store.history.live_workflow_ids(60)

    waiting = await store.dashboard.queue_waiting("default", live_workflows=live)

    assert {r["execution_id"]: r["blocked_reason"] for r in waiting} == {
        "q-v1": "no-worker-for-version", "q-v2": "due"}
