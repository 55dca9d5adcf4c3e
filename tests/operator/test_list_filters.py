"""Issue 20, item 5: strict list filters. An unknown query parameter is a 422
with a code (never silently ignored); `blockedBy=` selects by the one rule of
app/blocked.py (the same answer each item carries); `workflowId=` narrows;
`include=outcome` adds each item's outcome."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from app.blocked import REASONS
from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.responses import assert_error

pytestmark = pytest.mark.timeout(60)


async def listing(api: httpx.AsyncClient, **params) -> list[dict]:
    r = await api.get("/v1/executions", params=params)
    assert r.status_code == 200, r.text
    return r.json()["executions"]


async def some_of_each(store: ExecutionStore) -> dict[str, str]:
    """Executions in several blockedBy states: execution ID -> expected reason."""
    for eid in ("lf-leased", "lf-done", "lf-signal", "lf-failed"):
        await admit(store, "op-quick", eid)
    leases = {d.lease.execution_id: d.lease for d in await store.leases.claim_due(10, 30, "holder")}
    await store.leases.acknowledge(leases["lf-done"], "completed", result={"n": 1})
    await store.leases.acknowledge(leases["lf-failed"], "failed", error={"name": "Boom", "message": "m"})
    await store.leases.acknowledge(leases["lf-signal"], "suspended", waiting_on={"signal": "go"})
    await admit(store, "op-quick", "lf-due")
    await admit(store, "op-sleep", "lf-no-worker")
    await store.workers.register_worker("lf-w", host="test", pid=1, workflows=["op-quick"],
                                concurrency=1)
    return {"lf-leased": "leased", "lf-signal": "waiting-for-signal", "lf-due": "due",
            "lf-no-worker": "no-worker"}


@pytest.mark.parametrize("query", [{"blockedby": "due"}, {"foo": "1"}, {"status": "admitted",
                                                                          "stauts": "parked"}])
async def test_an_unknown_query_parameter_is_refused(api: httpx.AsyncClient, query) -> None:
    error = assert_error(await api.get("/v1/executions", params=query), 422,
                         "UNKNOWN_QUERY_PARAMETER")
    unknown = next(k for k in query if k not in ("status",))
    assert repr(unknown) in error["message"] and "blockedBy" in error["message"], error


async def test_other_list_routes_refuse_unknown_parameters_too(api: httpx.AsyncClient) -> None:
    assert_error(await api.get("/v1/workers", params={"alive": "true"}), 422,
                 "UNKNOWN_QUERY_PARAMETER")
    assert_error(await api.get("/v1/schedules", params={"nope": "1"}), 422,
                 "UNKNOWN_QUERY_PARAMETER")


async def test_blocked_by_selects_by_the_same_rule_items_carry(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    expected = await some_of_each(store)
    everything = await listing(api)
    by_item = {e["executionId"]: (e["blockedBy"] or {}).get("reason") for e in everything}
    assert {eid: by_item[eid] for eid in expected} == expected
    for reason in REASONS:
        if reason == "none":
            continue
        selected = await listing(api, blockedBy=reason)
        assert {e["executionId"] for e in selected} == {
            eid for eid, r in by_item.items() if r == reason}, reason
        assert all(e["blockedBy"]["reason"] == reason for e in selected)
    assert [e["executionId"] for e in await listing(api, blockedBy="no-worker",
                                                    workflowId="op-sleep")] == ["lf-no-worker"]
    assert await listing(api, blockedBy="no-worker", workflowId="op-quick") == []


async def test_blocked_by_names_the_valid_reasons(api: httpx.AsyncClient) -> None:
    error = assert_error(await api.get("/v1/executions", params={"blockedBy": "stuck"}), 422,
                         "INVALID_REQUEST")
    assert "sleeping" in error["message"] and "no-worker" in error["message"], error


async def test_workflow_id_narrows_the_list(store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await some_of_each(store)
    assert {e["executionId"] for e in await listing(api, workflowId="op-sleep")} == {
        "lf-no-worker"}
    assert all(e["workflowId"] == "op-quick" for e in await listing(api, workflowId="op-quick"))


async def test_include_outcome_adds_each_items_outcome(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await some_of_each(store)
    plain = await listing(api)
    assert all("outcome" not in e for e in plain)
    items = {e["executionId"]: e for e in await listing(api, include="outcome")}
    assert items["lf-done"]["outcome"] == {"result": {"n": 1}}
    assert items["lf-failed"]["outcome"]["error"]["name"] == "Boom"
    assert items["lf-due"]["outcome"] is None
    assert_error(await api.get("/v1/executions", params={"include": "params"}), 422,
                 "INVALID_REQUEST")
