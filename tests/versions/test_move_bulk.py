"""POST /v1/version-moves: the executions a filter matches are each
checked and moved in the request, a refusal of one does not stop the rest;
bad input is refused with nothing moved."""

from __future__ import annotations

from tests.support.claims import claim_one
from tests.support.history import events_of
from tests.support.responses import assert_error
from tests.versions import flows
from tests.versions.conftest import admit

URL = "/v1/version-moves"


async def versions_of(store, *eids: str) -> dict[str, str | None]:
    return {eid: (await store.history.get(eid))["code_version"] for eid in eids}


async def test_each_match_is_checked_and_moved_and_refusals_are_listed(
        api, store, suspended) -> None:
    await suspended("b1", "b2", "b3")
    await admit(store, "b-running")
    await claim_one(store, "b-running")
    await admit(store, "b-ended")
    assert (await api.post("/v1/executions/b-ended/terminate", json=None)).status_code == 202
    await admit(store, "b-unversioned", None)

    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "fromVersion": "1"}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["moved"] == ["b1", "b2", "b3"]
    [refused] = answer["refused"]
    assert refused["executionId"] == "b-running" and refused["code"] == "EXECUTION_RUNNING"
    assert refused["divergence"] is None
    # The ended one is not matched; the unversioned one is not of version 1.
    assert answer["matched"] == 4 and answer["more"] is False and answer["dryRun"] is False
    assert await versions_of(store, "b1", "b2", "b3", "b-running", "b-ended",
                             "b-unversioned") == {
        "b1": "2", "b2": "2", "b3": "2", "b-running": "1", "b-ended": "1",
        "b-unversioned": None}
    [event] = await events_of(store, "b2", "version_moved")
    assert event["detail"] == {"from": "1", "to": "2", "by": "api", "check": "passed"}

    # fromVersion null: only the unversioned one.
    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "fromVersion": None}})
    assert r.json()["moved"] == ["b-unversioned"] and r.json()["matched"] == 1


async def test_limit_dry_run_status_and_ids(api, store, suspended) -> None:
    await suspended("c1", "c2", "c3")
    await admit(store, "c-admitted")
    body = {"to": "2", "filter": {"workflowId": "vm-order"}, "limit": 2, "dryRun": True}
    r = await api.post(URL, json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"moved": ["c1", "c2"], "refused": [], "matched": 4, "more": True,
                        "dryRun": True}
    assert set((await versions_of(store, "c1", "c2", "c3", "c-admitted")).values()) == {"1"}
    assert await events_of(store, "c1", "version_moved") == []

    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "status": ["admitted"]}})
    assert r.json()["moved"] == ["c-admitted"] and r.json()["matched"] == 1
    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "ids": ["c3", "nobody"]}})
    assert r.json()["moved"] == ["c3"] and r.json()["matched"] == 1
    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "fromVersion": "1"}, "limit": 1})
    assert r.json()["moved"] == ["c1"] and r.json()["more"] is True
    r = await api.post(URL, json={"to": "2", "filter": {"workflowId": "vm-order",
                                                        "fromVersion": "1"}})
    assert r.json()["moved"] == ["c2"] and r.json()["more"] is False
    assert set((await versions_of(store, "c1", "c2", "c3", "c-admitted")).values()) == {"2"}


async def test_divergent_histories_are_refused_each_with_its_divergence(
        api_for, store, suspended) -> None:
    await suspended("d1", "d2")
    async with api_for(flows.V3) as api:
        r = await api.post(URL, json={"to": "3", "filter": {"workflowId": "vm-order"}})
        assert r.status_code == 200, r.text
        assert r.json()["moved"] == []
        refused = r.json()["refused"]
        assert [x["executionId"] for x in refused] == ["d1", "d2"]
        for x in refused:
            assert x["code"] == "REPLAY_DIVERGES", x
            assert x["divergence"]["recorded"] == "reserve"
            assert x["divergence"]["asked"] == "check"
        r = await api.post(URL, json={"to": "4", "filter": {"workflowId": "vm-order"}})
        assert {x["code"] for x in r.json()["refused"]} == {"REPLAY_CHECK_UNAVAILABLE"}
        r = await api.post(URL, json={"to": "4", "force": True,
                                      "filter": {"workflowId": "vm-order"}})
        assert r.json()["moved"] == ["d1", "d2"]
    assert await versions_of(store, "d1", "d2") == {"d1": "4", "d2": "4"}


async def test_bad_input_is_refused_and_nothing_moves(api, store) -> None:
    await admit(store, "e1")
    good = {"to": "2", "filter": {"workflowId": "vm-order"}}
    bad = [
        {"to": "2"},                                            # no filter
        {"to": "2", "filter": {}},                              # no workflowId
        {"filter": {"workflowId": "vm-order"}},                 # no to
        {**good, "filter": {"workflowId": "vm order"}},
        {**good, "filter": {"workflowId": "vm-order", "status": ["completed"]}},
        {**good, "filter": {"workflowId": "vm-order", "status": []}},
        {**good, "filter": {"workflowId": "vm-order", "ids": []}},
        {**good, "filter": {"workflowId": "vm-order", "fromVersion": ""}},
        {**good, "filter": {"workflowId": "vm-order", "other": 1}},
        {**good, "limit": 0}, {**good, "limit": 1001}, {**good, "limit": "5"},
        {**good, "limit": 1.5}, {**good, "dryRun": "no"}, {**good, "force": 0},
        {**good, "to": ""}, {**good, "extra": True},
    ]
    for body in bad:
        assert_error(await api.post(URL, json=body), 422, "INVALID_REQUEST")
    assert (await store.history.get("e1"))["code_version"] == "1"
    assert await events_of(store, "e1", "version_moved") == []
    r = await api.post(URL, json={**good, "limit": 1000})
    assert r.status_code == 200 and r.json()["moved"] == ["e1"]
