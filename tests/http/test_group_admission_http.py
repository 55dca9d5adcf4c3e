"""Issue 18, item 2, through the API: concurrent POST /v1/executions in one
API process are admitted in batches (one statement each), and every request
still gets its own answer: 201 with its execution, 409 naming the execution
that holds its ID (taken in the same batch, in another batch, or before),
200 for ifExists=return with equal params, 422 for a value Postgres cannot
store (its neighbours admitted). The real app, in-process, on real Postgres."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import httpx

from app.store import ExecutionStore
from tests.support.responses import assert_error, post_raw


def group_of(client: httpx.AsyncClient) -> Any:
    store: ExecutionStore = client.app.state.store  # type: ignore[attr-defined]
    assert store.admissions.group is not None
    return store.admissions.group


async def test_concurrent_posts_each_get_their_own_201_or_409(
        client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    r = await client.post("/v1/executions", json={
        "workflowId": "gh-wf", "executionId": "gh-before", "params": {"v": 0}})
    assert r.status_code == 201, r.text
    group = group_of(client)
    batches_before, requests_before = group.batches, group.requests

    bodies: list[dict[str, Any]] = []
    for i in range(60):
        if i % 10 == 3:
            eid = "gh-dup"  # six requests for one ID, concurrently
        elif i % 10 == 7:
            eid = "gh-before"  # admitted before these
        else:
            eid = f"gh-{i}"
        bodies.append({"workflowId": f"gh-wf-{i % 2}", "executionId": eid,
                       "params": {"i": i}, "context": {"c": i}})
    bodies[59] = {"workflowId": "gh-wf", "executionId": "gh-before", "params": {"v": 0},
                  "ifExists": "return"}
    answers = await asyncio.gather(*(client.post("/v1/executions", json=b) for b in bodies))

    assert group.requests - requests_before == 60
    assert group.batches - batches_before < 60  # some requests shared a statement
    created = Counter(b["executionId"] for b, r in zip(bodies, answers, strict=True)
                      if r.status_code == 201)
    assert created["gh-dup"] == 1 and created["gh-before"] == 0, created
    dup_winner = next(b for b, r in zip(bodies, answers, strict=True)
                      if b["executionId"] == "gh-dup" and r.status_code == 201)
    for body, r in zip(bodies, answers, strict=True):
        eid = body["executionId"]
        if body.get("ifExists") == "return":
            assert r.status_code == 200, r.text
            assert r.json()["executionId"] == "gh-before"
            assert r.json()["params"] == {"v": 0}
        elif eid == "gh-before" or (eid == "gh-dup" and body is not dup_winner):
            error = assert_error(r, 409, "EXECUTION_ID_CONFLICT")
            assert error["executionId"] == eid
            assert error["status"] == "admitted"
            holder = "gh-wf" if eid == "gh-before" else dup_winner["workflowId"]
            assert error["workflowId"] == holder, error
            assert "location" not in r.headers
        else:
            assert r.status_code == 201, r.text
            assert r.json() == {"executionId": eid, "status": "admitted"}
            assert r.headers["location"] == f"/v1/executions/{eid}"
    stored = {row["execution_id"]: row for row in await pool.fetch(
        "SELECT e.execution_id, e.params, e.context, "
        "       (SELECT count(*) FROM execution_events v "
        "        WHERE v.execution_id = e.execution_id) AS events "
        "FROM executions e")}
    assert set(stored) == {b["executionId"] for b in bodies}
    assert stored["gh-dup"]["params"] == dup_winner["params"]
    assert stored["gh-before"]["params"] == {"v": 0}
    assert all(row["events"] == 1 for row in stored.values())


async def test_an_unstorable_post_among_concurrent_ones_is_the_only_422(
        client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    group = group_of(client)
    batches_before = group.batches
    good = [client.post("/v1/executions", json={
        "workflowId": "gh-wf", "executionId": f"gh-ok-{i}", "params": {"i": i}})
        for i in range(20)]
    # Passes the API's checks; the store's encoder refuses it (jsonb would
    # give it back as an integer).
    bad = post_raw(client, '{"workflowId":"gh-wf","executionId":"gh-bad","params":{"x":1e23}}')
    *answers, refused = await asyncio.gather(*good, bad)
    error = assert_error(refused, 422, "INVALID_EXECUTION_EVENT")
    assert "1e+23" in error["message"] and "gh-ok" not in error["message"], error
    for i, r in enumerate(answers):
        assert r.status_code == 201, r.text
        assert r.json() == {"executionId": f"gh-ok-{i}", "status": "admitted"}
    assert group.batches - batches_before < 21
    assert await pool.fetchval("SELECT count(*) FROM executions") == 20
    assert await pool.fetchval("SELECT count(*) FROM execution_events") == 20
