"""Bounded reads (issue 11, item 8, part): `steps` and `late-observations` are
paginated like `events`, and the listing's filters use indexes: EXPLAIN of the
listing's own statement over 100k executions shows no Seq Scan on executions
for a trigger token listing its own, admittedAt ranges, and each status."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from app.store import Admitted, ExecutionStore, RetryingPool
from tests.support.responses import assert_error


async def execution_with(store, tokens, steps: int, late: int) -> str:
    eid = "paged-1"
    answer = await store.admissions.admit(workflow_id="wf", params={}, execution_id=eid,
                               admitted_by=tokens.a.token_id)
    assert isinstance(answer, Admitted)
    [first] = await store.leases.claim_due(1, 30, "worker-1")
    await store.pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                             "WHERE execution_id = $1", eid)
    [d] = await store.leases.claim_due(1, 30, "worker-2")
    for i in range(steps):
        await store.steps.write_step(d.lease, f"step-{i:03d}", value={"i": i}, function_name="f")
    for i in range(late):
        await store.steps.record_late_observation(first.lease, f"late-{i:03d}", value={"i": i})
    return eid


async def test_steps_are_paginated_with_a_cursor(api, tokens, store):
    eid = await execution_with(store, tokens, steps=7, late=0)
    # An effect attempt in doubt comes after the recorded steps.
    await store.pool.execute(
        "INSERT INTO effects (execution_id, bucket, step_key, status, attempts, token, "
        "function_name, idempotency_key) VALUES ($1, fencepost_bucket($1), 'charge', "
        "'outcome_unknown', 1, 2, 'charge', 'k')", eid)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, "includeValues": "true", **({"cursor": cursor} if cursor else {})}
        r = await api.get(f"/v1/executions/{eid}/steps", params=params, headers=tokens.a.headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["steps"]) <= 3
        seen += body["steps"]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert pages == 3
    assert [s["stepKey"] for s in seen] == [f"step-{i:03d}" for i in range(7)] + ["charge"]
    assert [s["result"] for s in seen[:7]] == [{"i": i} for i in range(7)]
    everything = (await api.get(f"/v1/executions/{eid}/steps", headers=tokens.a.headers)).json()
    assert [s["stepKey"] for s in everything["steps"]] == [s["stepKey"] for s in seen]
    assert everything["nextCursor"] is None
    # The last: [3, time, key], a group the listing does not have.
    for bad in ("nope", "W10", "WzMsIjIwMjYtMDEtMDFUMDA6MDA6MDBaIiwieCJd"):
        assert_error(await api.get(f"/v1/executions/{eid}/steps", params={"cursor": bad},
                                   headers=tokens.a.headers), 422, "INVALID_CURSOR")
    assert_error(await api.get(f"/v1/executions/{eid}/steps", params={"limit": 0},
                               headers=tokens.a.headers), 422)


async def test_late_observations_are_paginated_after_an_id(api, tokens, store):
    eid = await execution_with(store, tokens, steps=0, late=5)
    seen, after = [], 0
    for _ in range(3):
        r = await api.get(f"/v1/executions/{eid}/late-observations",
                          params={"limit": 2, "after": after}, headers=tokens.a.headers)
        assert r.status_code == 200, r.text
        body = r.json()
        seen += body["lateObservations"]
        if body["nextAfter"] is None:
            break
        assert body["nextAfter"] == body["lateObservations"][-1]["observationId"]
        after = body["nextAfter"]
    assert [o["stepKey"] for o in seen] == [f"late-{i:03d}" for i in range(5)]
    assert body["nextAfter"] is None


# -- the listing's filters use indexes at 100k rows -----------------------------------

N = 100_000


@pytest.fixture
async def hundred_k(pool, tokens):
    """100k executions: mostly completed, some of every other status, admitted
    over ~28 hours by 50 tokens; tenant A admitted 1 in 1000."""
    await pool.execute(
        """
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, outcome,
                                admitted_at, updated_at, admitted_by, due_at, lease_owner,
                                lease_expires_at, token, deadline)
        SELECT 'bulk-' || g, fencepost_bucket('bulk-' || g), 'wf-' || (g % 20), '{}', s.status,
               CASE WHEN s.status IN ('completed', 'failed', 'cancelled', 'timed_out')
                    THEN '{"result": null}'::jsonb END,
               now() - g * interval '1 second', now(),
               CASE WHEN g % 1000 = 0 THEN $1 ELSE 'tok-' || (g % 50) END,
               CASE WHEN s.status IN ('admitted', 'suspended') THEN now() END,
               CASE WHEN s.status = 'running' THEN 'w' END,
               CASE WHEN s.status = 'running' THEN now() + interval '30 seconds' END,
               1, CASE WHEN g % 7 = 0 THEN now() + interval '1 day' END
        FROM generate_series(1, $2) g
        CROSS JOIN LATERAL (SELECT CASE
            WHEN g % 100 < 90 THEN 'completed' WHEN g % 100 < 93 THEN 'failed'
            WHEN g % 100 = 93 THEN 'admitted' WHEN g % 100 = 94 THEN 'suspended'
            WHEN g % 100 = 95 THEN 'running' WHEN g % 100 = 96 THEN 'parked'
            WHEN g % 100 = 97 THEN 'cancelled' ELSE 'timed_out' END AS status) s
        """,
        tokens.a.token_id, N)
    await pool.execute("ANALYZE executions")
    return N


class Recording(RetryingPool):
    """A pool that keeps every statement it runs (and its arguments)."""

    def __init__(self, pool):
        super().__init__(pool.raw if isinstance(pool, RetryingPool) else pool)
        self.statements: list[tuple[str, tuple]] = []

    async def fetch(self, query, *args, **kw):
        self.statements.append((query, args))
        return await super().fetch(query, *args, **kw)


async def plan_of(pool, settings, **filters) -> dict:
    """EXPLAIN of the statement the store's listing runs for these filters."""
    recording = Recording(pool)
    await ExecutionStore.from_settings(recording, settings).history.list(limit=50, **filters)
    [(query, args)] = recording.statements
    async with pool.acquire() as conn:
        [row] = await conn.fetch("EXPLAIN (FORMAT JSON) " + query, *args)
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return plan[0]["Plan"]


def scans(node: dict) -> list[tuple[str, str | None, str | None]]:
    out = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"))]
    for child in node.get("Plans", []):
        out += scans(child)
    return out


STATUS_INDEXES = {"ix_executions_status_admitted", "ix_executions_lease_expiry",
                  "ix_executions_due", "ix_executions_deadline"}
NOW = datetime.now(UTC)
FILTERS = {
    "own (trigger)": {"admitted_by": "A"},
    "own, status completed": {"admitted_by": "A", "status": "completed"},
    "admittedAt range": {"admitted_after": NOW - timedelta(hours=2),
                         "admitted_before": NOW - timedelta(hours=1)},
    "admittedAfter": {"admitted_after": NOW - timedelta(minutes=5)},
    "admittedBefore": {"admitted_before": NOW - timedelta(hours=20)},
    **{f"status {s}": {"status": s} for s in (
        "admitted", "suspended", "running", "parked", "completed", "failed", "cancelled",
        "timed_out")},
    "status and range": {"status": "failed", "admitted_after": NOW - timedelta(hours=3)},
    "no filter": {},
}


@pytest.mark.parametrize("name", list(FILTERS))
async def test_the_listing_uses_an_index_for_each_filter(name, hundred_k, tenancy_settings,
                                                         pool, tokens, api):
    filters = dict(FILTERS[name])
    if filters.get("admitted_by") == "A":
        filters["admitted_by"] = tokens.a.token_id
    nodes = scans(await plan_of(pool, tenancy_settings, **filters))
    print(f"\n{name}: {nodes}")
    assert any(relation == "executions" for _, relation, _ in nodes), nodes
    assert ("Seq Scan", "executions", None) not in nodes, (name, nodes)
    if filters.get("admitted_by"):
        assert any(ix == "ix_executions_admitted_by_admitted" for *_, ix in nodes), nodes
    elif filters.get("status") not in (None, "completed"):
        # A rare status is found through an index on status, not by walking
        # every execution newest first and filtering (completed, 90% of the
        # rows, is rightly read in admittedAt order).
        assert any(ix in STATUS_INDEXES for *_, ix in nodes), (name, nodes)

    # And the API answers the same filters (one page, newest first, all matching).
    params = {}
    if "status" in filters:
        params["status"] = filters["status"]
    for key, alias in (("admitted_after", "admittedAfter"), ("admitted_before", "admittedBefore")):
        if key in filters:
            params[alias] = filters[key].isoformat()
    token = tokens.a if filters.get("admitted_by") else tokens.read
    r = await api.get("/v1/executions", params=params, headers=token.headers)
    assert r.status_code == 200, r.text
    rows = r.json()["executions"]
    assert rows, name
    times = [datetime.fromisoformat(e["admittedAt"]) for e in rows]
    assert times == sorted(times, reverse=True)
    for e, at in zip(rows, times, strict=True):
        if "status" in filters:
            assert e["status"] == filters["status"], e
        if "admitted_after" in filters:
            assert at >= filters["admitted_after"], e
        if "admitted_before" in filters:
            assert at < filters["admitted_before"], e
    if filters.get("admitted_by"):
        assert len({e["executionId"] for e in rows}) == len(rows)
        assert all(int(e["executionId"].split("-")[1]) % 1000 == 0 for e in rows), rows[:3]


async def test_the_time_range_parameters_are_checked(api, tokens):
    for params in ({"admittedAfter": "2026-01-01T00:00:00"}, {"admittedBefore": "yesterday"},
                   {"admittedAfter": "0001-01-01T00:00:00+01:00"}):
        assert_error(await api.get("/v1/executions", params=params, headers=tokens.read.headers),
                     422)
