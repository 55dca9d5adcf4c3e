"""/v1/queues against the real app and database: reading queues, changing
their run-time settings (which win over the declared ones until reset),
pausing and resuming, who may do it, and every refusal's code."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from app.api.auth import new_token
from app.queues import Queue
from app.registry import load_workflows
from app.sdk import WorkflowContext, workflow
from tests.http.conftest import api_settings
from tests.support.asgi import asgi_client
from tests.support.responses import JSON, assert_error

DECLARED = Queue("qa-declared", concurrency=5, rate_limit=(100, 60))


@workflow("qa-on-declared", queue=DECLARED)
async def qa_on_declared(ctx: WorkflowContext, params) -> None:
    return None


@pytest_asyncio.fixture
async def qa(settings):
    async with asgi_client(api_settings(settings), load_workflows([__name__])) as c:
        yield c


UNLIMITED = {"concurrency": None, "perKeyConcurrency": None, "rateLimit": None,
             "holdWhileSuspended": False, "paused": False}


async def test_a_declared_queue_is_listed_with_its_settings_and_counts(qa) -> None:
    r = await qa.get("/v1/queues")
    assert r.status_code == 200, r.text
    by_name = {q["name"]: q for q in r.json()["queues"]}
    assert set(by_name) == {"default", "qa-declared"}
    declared = by_name["qa-declared"]
    assert declared["declared"] == {
        "concurrency": 5, "perKeyConcurrency": None,
        "rateLimit": {"limit": 100, "periodSeconds": 60.0, "perKey": False},
        "holdWhileSuspended": False}
    assert declared["override"] == {}
    assert declared["effective"] == {**UNLIMITED, "concurrency": 5,
                                     "rateLimit": declared["declared"]["rateLimit"]}
    assert declared["counts"] == {"running": 0, "due": 0, "startsInPeriod": 0}
    assert by_name["default"]["effective"] == UNLIMITED
    assert by_name["default"]["counts"]["startsInPeriod"] is None


async def test_an_override_wins_and_reset_brings_the_declared_setting_back(qa) -> None:
    r = await qa.put("/v1/queues/qa-declared",
                     json={"concurrency": 2, "rateLimit": None, "holdWhileSuspended": True})
    assert r.status_code == 200, r.text
    q = r.json()
    assert q["override"] == {"concurrency": 2, "rateLimit": None, "holdWhileSuspended": True}
    assert q["effective"] == {**UNLIMITED, "concurrency": 2, "holdWhileSuspended": True}
    assert q["declared"]["concurrency"] == 5
    assert (await qa.get("/v1/queues/qa-declared")).json()["effective"] == q["effective"]
    r = await qa.put("/v1/queues/qa-declared", json={"reset": ["concurrency", "rateLimit"]})
    assert r.status_code == 200, r.text
    q = r.json()
    assert q["override"] == {"holdWhileSuspended": True}
    assert q["effective"]["concurrency"] == 5
    assert q["effective"]["rateLimit"] == {"limit": 100, "periodSeconds": 60.0, "perKey": False}
    r = await qa.put("/v1/queues/qa-declared", json={"concurrency": None})
    assert r.json()["effective"]["concurrency"] is None


async def test_a_change_is_listed_with_who_made_it(qa) -> None:
    await qa.put("/v1/queues/qa-declared", json={"perKeyConcurrency": 1,
                                                 "rateLimit": {"limit": 3, "periodSeconds": 1,
                                                               "perKey": True}})
    await qa.post("/v1/queues/qa-declared/pause")
    q = (await qa.get("/v1/queues/qa-declared")).json()
    assert q["effective"]["paused"] is True
    assert q["effective"]["rateLimit"] == {"limit": 3, "periodSeconds": 1.0, "perKey": True}
    changes = q["changes"]
    assert [(c["actor"], c["change"]) for c in changes] == [
        ("api", {"set": {"paused": True}, "reset": []}),
        ("api", {"set": {"perKeyConcurrency": 1,
                         "rateLimit": {"limit": 3, "periodSeconds": 1.0, "perKey": True}},
                 "reset": []}),
        ("code", {"declared": {"concurrency": 5, "perKeyConcurrency": None,
                               "rateLimit": {"limit": 100, "periodSeconds": 60.0,
                                             "perKey": False},
                               "holdWhileSuspended": False}}),
    ]
    assert all(c["at"] for c in changes)
    r = await qa.post("/v1/queues/qa-declared/resume")
    assert r.status_code == 200 and r.json()["effective"]["paused"] is False


async def test_the_changes_shown_are_the_newest_twenty(qa) -> None:
    for n in range(1, 26):
        await qa.put("/v1/queues/busy", json={"concurrency": n})
    changes = (await qa.get("/v1/queues/busy")).json()["changes"]
    assert [c["change"]["set"]["concurrency"] for c in changes] == list(range(25, 5, -1))


async def test_a_put_creates_a_queue_nobody_declared(qa) -> None:
    assert_error(await qa.get("/v1/queues/fresh"), 404, "QUEUE_NOT_FOUND")
    r = await qa.put("/v1/queues/fresh", json={"concurrency": 1})
    assert r.status_code == 200, r.text
    assert r.json()["declared"] == {}
    assert r.json()["effective"]["concurrency"] == 1
    assert "fresh" in {q["name"] for q in (await qa.get("/v1/queues")).json()["queues"]}


async def test_counts_show_what_runs_and_what_is_due(qa, store) -> None:
    for i in range(3):
        r = await qa.post("/v1/executions", json={"workflowId": "qa-on-declared",
                                                  "executionId": f"e{i}"})
        assert r.status_code == 201, r.text
    [delivery] = await store.leases.claim_due(1, 30.0, "w")
    counts = (await qa.get("/v1/queues/qa-declared")).json()["counts"]
    assert counts == {"running": 1, "due": 2, "startsInPeriod": 1}


@pytest.mark.parametrize(("path", "method"), [
    ("/v1/queues/nowhere", "get"), ("/v1/queues/nowhere/pause", "post"),
    ("/v1/queues/nowhere/resume", "post"), ("/v1/queues/bad%20name", "get"),
    ("/v1/queues/bad%00name/pause", "post"),
])
async def test_an_unknown_queue_is_not_found(qa, path, method) -> None:
    error = assert_error(await qa.request(method, path), 404, "QUEUE_NOT_FOUND")
    assert "GET /v1/queues" in error["message"]


@pytest.mark.parametrize("body", [
    [], "x", None, {"concurrency": 0}, {"concurrency": 1_000_001}, {"concurrency": 1.5},
    {"concurrency": True}, {"concurrency": "3"}, {"perKeyConcurrency": -1},
    {"rateLimit": {"limit": 5}}, {"rateLimit": {"limit": 5, "periodSeconds": 0}},
    {"rateLimit": {"limit": 5, "periodSeconds": 1e-7}},
    {"rateLimit": {"limit": 5, "periodSeconds": 86400 * 32}},
    {"rateLimit": {"limit": 5, "periodSeconds": "60"}},
    {"rateLimit": {"limit": 5, "periodSeconds": 1, "perKey": 1}},
    {"rateLimit": {"limit": 5, "periodSeconds": 1, "extra": 1}}, {"rateLimit": 5},
    {"paused": None}, {"paused": "yes"}, {"holdWhileSuspended": 0},
    {"reset": ["speed"]}, {"reset": "concurrency"}, {"speed": 3}, {"per_key_concurrency": 1},
])
async def test_bad_settings_are_refused_with_what_to_fix(qa, body) -> None:
    r = await qa.put("/v1/queues/qa-declared", content=json.dumps(body), headers=JSON)
    error = assert_error(r, 422, "INVALID_QUEUE_SETTINGS")
    assert "fix it" in error["message"] or "body must be" in error["message"]
    q = (await qa.get("/v1/queues/qa-declared")).json()
    assert q["override"] == {} and len(q["changes"]) == 1


async def test_a_name_no_queue_can_have_is_refused(qa) -> None:
    error = assert_error(await qa.put("/v1/queues/" + "q" * 201, json={}), 422,
                         "INVALID_QUEUE_SETTINGS")
    assert "1-200 characters" in error["message"]


async def test_malformed_bodies_are_refused_in_the_one_shape(qa) -> None:
    r = await qa.put("/v1/queues/q", content=b'{"concurrency": 1, "concurrency": 2}',
                     headers=JSON)
    assert r.status_code in (400, 422), r.text
    assert_error(r, r.status_code)
    assert_error(await qa.put("/v1/queues/q", content=b"{", headers=JSON), 400, "MALFORMED_JSON")
    assert_error(await qa.put("/v1/queues/q", content=b"{}",
                              headers={"content-type": "text/plain"}), 415)
    assert_error(await qa.get("/v1/queues", params={"limit": 5}), 422,
                 "UNKNOWN_QUERY_PARAMETER")


async def test_only_operate_changes_a_queue_and_read_reads_it(settings, store) -> None:
    tokens = {}
    for role in ("trigger", "read", "operate"):
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=f"{role}-token", role=role,
                                        secret_sha256=digest)
        tokens[role] = {"Authorization": f"Bearer {token}"}
    async with asgi_client(api_settings(settings, auth="enabled"),
                           raise_app_exceptions=False) as c:
        assert_error(await c.get("/v1/queues"), 401, "UNAUTHENTICATED")
        assert_error(await c.put("/v1/queues/default", json={"paused": True}), 401)
        for role in ("trigger", "read"):
            assert_error(await c.put("/v1/queues/default", json={"paused": True},
                                     headers=tokens[role]), 403, "FORBIDDEN")
            for action in ("pause", "resume"):
                assert_error(await c.post(f"/v1/queues/default/{action}",
                                          headers=tokens[role]), 403, "FORBIDDEN")
        assert_error(await c.get("/v1/queues", headers=tokens["trigger"]), 403, "FORBIDDEN")
        assert_error(await c.get("/v1/queues/default", headers=tokens["trigger"]), 403)
        r = await c.put("/v1/queues/default", json={"concurrency": 4}, headers=tokens["operate"])
        assert r.status_code == 200, r.text
        r = await c.post("/v1/queues/default/pause", headers=tokens["operate"])
        assert r.status_code == 200, r.text
        q = (await c.get("/v1/queues/default", headers=tokens["read"])).json()
        assert q["effective"]["paused"] is True and q["effective"]["concurrency"] == 4
        assert [c["actor"] for c in q["changes"]] == ["operate-token", "operate-token"]
        assert (await c.get("/v1/queues", headers=tokens["read"])).status_code == 200
