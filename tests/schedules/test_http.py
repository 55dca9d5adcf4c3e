"""The /v1/schedules routes against the real app and Postgres: create, list,
read, events, pause, resume, delete; bad input in the one error shape; roles;
no 500 on odd input."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from app.api.auth import new_token
from tests.http.conftest import api_settings
from tests.http.test_no_500 import CONTENT_TYPES, ODD_BODIES, ODD_IDS, _sweep
from tests.schedules.conftest import WORKFLOWS
from tests.support.asgi import asgi_client
from tests.support.responses import assert_error

BODY = {"scheduleId": "nightly", "workflowId": "sched-test-plain", "cron": "30 2 * * *",
        "timezone": "Europe/Warsaw"}


@pytest.fixture
async def client(settings):
    async with asgi_client(api_settings(settings), raise_app_exceptions=False) as c:
        yield c


@pytest.fixture
async def registry_client(settings):
    async with asgi_client(api_settings(settings), WORKFLOWS, raise_app_exceptions=False) as c:
        yield c


async def create(client, **changes) -> dict:
    r = await client.post("/v1/schedules", json={**BODY, **changes})
    assert r.status_code == 201, r.text
    return r.json()


# ------------------------------------------------------------------ create


async def test_create_read_list(client):
    r = await client.post("/v1/schedules", json={**BODY, "params": {"day": "x"}, "catchUp": 3})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/schedules/nightly"
    body = r.json()
    assert {k: body[k] for k in ("scheduleId", "workflowId", "cron", "timezone", "params",
                                 "paused", "catchUp", "source")} == {
        "scheduleId": "nightly", "workflowId": "sched-test-plain", "cron": "30 2 * * *",
        "timezone": "Europe/Warsaw", "params": {"day": "x"}, "paused": False, "catchUp": 3,
        "source": "api"}
    next_slot = datetime.fromisoformat(body["nextSlot"])
    assert next_slot > datetime.fromisoformat(body["lastSlot"])
    assert next_slot.minute == 30 and next_slot.hour in (0, 1)  # 02:30 Warsaw in UTC

    r = await client.get("/v1/schedules/nightly")
    assert r.status_code == 200 and r.json() == body

    r = await client.get("/v1/schedules")
    assert r.status_code == 200 and r.json() == {"schedules": [body], "nextCursor": None}


async def test_defaults_and_normalised_cron(client):
    body = await create(client, cron="  @daily ")
    assert body["cron"] == "0 0 * * *" and body["params"] == {} and body["catchUp"] is None


async def test_an_existing_id_is_409(client):
    await create(client)
    r = await client.post("/v1/schedules", json={**BODY, "cron": "0 * * * *"})
    error = assert_error(r, 409, "SCHEDULE_EXISTS")
    assert error["scheduleId"] == "nightly" and error["workflowId"] == "sched-test-plain"
    assert (await client.get("/v1/schedules/nightly")).json()["cron"] == "30 2 * * *"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"cron": "0 2 * *"}, "expected 5 fields"),
        ({"cron": "0 24 * * *"}, "hour: 24 is out of range"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": ""}, "cron"),
        ({"cron": 5}, "cron"),
        ({"cron": "x" * 201}, "cron"),
        ({"timezone": "Mars/Olympus"}, "IANA time zone"),
        ({"timezone": "../../etc/passwd"}, "IANA time zone"),
        ({"timezone": ""}, "timezone"),
        ({"scheduleId": "has space"}, "scheduleId"),
        ({"scheduleId": "x" * 183}, "scheduleId"),
        ({"scheduleId": ""}, "scheduleId"),
        ({"workflowId": "a/b"}, "workflowId"),
        ({"catchUp": 0}, "catchUp"),
        ({"catchUp": 1001}, "catchUp"),
        ({"catchUp": "3"}, "catchUp"),
        ({"catchUp": True}, "catchUp"),
        ({"catchUp": 1.5}, "catchUp"),
        ({"schedule_id": "x"}, "schedule_id"),
        ({"extra": 1}, "extra"),
    ],
)
async def test_bad_schedules_are_422(client, changes, says):
    r = await client.post("/v1/schedules", json={**BODY, **changes})
    error = assert_error(r, 422, "INVALID_SCHEDULE")
    assert says in error["message"], error
    assert (await client.get("/v1/schedules")).json()["schedules"] == []


@pytest.mark.parametrize("missing", ["scheduleId", "workflowId", "cron", "timezone"])
async def test_required_fields(client, missing):
    body = {k: v for k, v in BODY.items() if k != missing}
    error = assert_error(await client.post("/v1/schedules", json=body), 422, "INVALID_SCHEDULE")
    assert missing in error["message"]


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"1", b"null"])
async def test_not_an_object(client, body):
    r = await client.post("/v1/schedules", content=body,
                          headers={"content-type": "application/json"})
    assert_error(r, 422, "INVALID_SCHEDULE")


async def test_unstorable_or_malformed_json(client):
    r = await client.post("/v1/schedules", content=b'{"scheduleId":"a","scheduleId":"b"}',
                          headers={"content-type": "application/json"})
    assert r.status_code in (400, 422)
    assert_error(r, r.status_code)
    r = await client.post("/v1/schedules", content=b'{"params": NaN}',
                          headers={"content-type": "application/json"})
    assert_error(r, r.status_code)
    assert r.status_code in (400, 422)


async def test_with_a_registry_unknown_workflows_and_bad_params(registry_client):
    r = await registry_client.post("/v1/schedules", json={**BODY, "workflowId": "nope"})
    assert "sched-test-plain" in assert_error(r, 404, "WORKFLOW_NOT_FOUND")["message"]
    r = await registry_client.post("/v1/schedules", json={
        **BODY, "workflowId": "sched-test-nightly", "params": {"day": 5}})
    assert_error(r, 422, "INVALID_PARAMS")
    body = await create(registry_client, workflowId="sched-test-nightly", params={"day": "mon"})
    assert body["params"] == {"day": "mon"}


# ------------------------------------------------------------ reads, 404s


@pytest.mark.parametrize("schedule_id", ["ghost", "a%00b", "x" * 300, "%FF", "a%20b"])
async def test_unknown_schedules_are_404(client, schedule_id):
    for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/pause"),
                         ("POST", "/resume"), ("DELETE", "")]:
        r = await client.request(method, f"/v1/schedules/{schedule_id}{path}")
        assert_error(r, 404, "SCHEDULE_NOT_FOUND")


async def test_pagination_and_filter(client):
    for i in range(5):
        await create(client, scheduleId=f"s{i}",
                     workflowId="sched-test-plain" if i % 2 else "other")
    r = await client.get("/v1/schedules", params={"limit": 2})
    page = r.json()
    assert [s["scheduleId"] for s in page["schedules"]] == ["s0", "s1"]
    r = await client.get("/v1/schedules", params={"limit": 2, "cursor": page["nextCursor"]})
    assert [s["scheduleId"] for s in r.json()["schedules"]] == ["s2", "s3"]
    r = await client.get("/v1/schedules", params={"workflowId": "other"})
    assert [s["scheduleId"] for s in r.json()["schedules"]] == ["s0", "s2", "s4"]
    for query in ({"limit": 0}, {"limit": 501}, {"cursor": "a b"}, {"workflowId": "a/b"}):
        assert_error(await client.get("/v1/schedules", params=query), 422, "INVALID_REQUEST")


# --------------------------------------------------- pause, resume, delete


async def test_pause_resume_delete(client):
    await create(client)
    r = await client.post("/v1/schedules/nightly/pause")
    assert r.status_code == 200 and r.json()["paused"] is True and r.json()["nextSlot"] is None
    assert (await client.post("/v1/schedules/nightly/pause")).json()["paused"] is True
    r = await client.post("/v1/schedules/nightly/resume")
    assert r.status_code == 200 and r.json()["paused"] is False and r.json()["nextSlot"]
    r = await client.get("/v1/schedules/nightly/events")
    assert [e["kind"] for e in r.json()["events"]] == [
        "schedule_created", "schedule_paused", "schedule_resumed"]
    assert r.json()["events"][1]["detail"] == {"by": "api"}

    r = await client.delete("/v1/schedules/nightly")
    assert r.status_code == 204 and r.content == b""
    assert_error(await client.get("/v1/schedules/nightly"), 404, "SCHEDULE_NOT_FOUND")
    assert_error(await client.delete("/v1/schedules/nightly"), 404, "SCHEDULE_NOT_FOUND")
    # The ID is free again, with a fresh history.
    await create(client)
    events = (await client.get("/v1/schedules/nightly/events")).json()["events"]
    assert [e["kind"] for e in events] == ["schedule_created"]


# -------------------------------------------------------------------- roles


async def test_roles(settings, store):
    tokens = {}
    for role in ("trigger", "read", "operate"):
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=role, role=role, secret_sha256=digest)
        tokens[role] = {"Authorization": f"Bearer {token}"}
    async with asgi_client(api_settings(settings, auth="enabled"),
                           raise_app_exceptions=False) as c:
        assert_error(await c.get("/v1/schedules"), 401, "UNAUTHENTICATED")
        assert_error(await c.post("/v1/schedules", json=BODY), 401, "UNAUTHENTICATED")
        for role in ("trigger", "read"):
            r = await c.post("/v1/schedules", json=BODY, headers=tokens[role])
            assert_error(r, 403, "FORBIDDEN")
        r = await c.post("/v1/schedules", json=BODY, headers=tokens["operate"])
        assert r.status_code == 201, r.text
        assert_error(await c.get("/v1/schedules", headers=tokens["trigger"]), 403, "FORBIDDEN")
        assert_error(await c.get("/v1/schedules/nightly", headers=tokens["trigger"]), 403)
        assert (await c.get("/v1/schedules/nightly", headers=tokens["read"])).status_code == 200
        for path in ("/v1/schedules/nightly/pause", "/v1/schedules/nightly/resume"):
            assert_error(await c.post(path, headers=tokens["read"]), 403, "FORBIDDEN")
        assert_error(await c.delete("/v1/schedules/nightly", headers=tokens["read"]), 403)
        r = await c.post("/v1/schedules/nightly/pause", headers=tokens["operate"])
        assert r.status_code == 200
        events = (await c.get("/v1/schedules/nightly/events", headers=tokens["read"])).json()
        assert events["events"][-1]["detail"] == {"by": "operate"}
        assert events["events"][0]["detail"]["by"] == "operate"
        r = await c.delete("/v1/schedules/nightly", headers=tokens["operate"])
        assert r.status_code == 204


# ---------------------------------------------------------------- no 500s


async def test_no_500_on_odd_input(client, registry_client):
    await create(client, scheduleId="s1")
    requests = []
    for body in ODD_BODIES:
        requests.append(("POST", "/v1/schedules",
                         {"content": body, "headers": {"content-type": "application/json"}}))
    for content_type in CONTENT_TYPES:
        requests.append(("POST", "/v1/schedules", {"content": b'{"scheduleId":"x"}',
                                                   "headers": {"content-type": content_type}}))
    requests += [("POST", "/v1/schedules", {}), ("POST", "/v1/schedules", {"content": b"{}"})]
    for odd in ["\u0000", "\ud800", "x\x00", "*/0 * * * *", "9" * 100, "@", "* * * * * * * *",
                "0-99999999999999999999 * * * *", "*/99999999999999999999 * * * *", "L W # ?"]:
        for field in ("cron", "timezone", "scheduleId", "workflowId"):
            # ensure_ascii: lone surrogates travel as \ud800 escapes.
            requests.append(("POST", "/v1/schedules", {
                "content": json.dumps({**BODY, field: odd}).encode(),
                "headers": {"content-type": "application/json"}}))
    for params in [10**400, "\u0000", {"a": 1e308}, [[[[]]]]]:
        requests.append(("POST", "/v1/schedules", {"json": {**BODY, "scheduleId": "p",
                                                            "params": params}}))
    for schedule_id in ODD_IDS + ["s1"]:
        for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/pause"),
                             ("POST", "/resume"), ("DELETE", ""), ("PUT", ""), ("PATCH", "")]:
            requests.append((method, f"/v1/schedules/{schedule_id}{path}", {}))
    for query in ["limit=%00", "limit=" + "9" * 50, "cursor=%00", "cursor=%ED%A0%80",
                  "workflowId=%00", "cursor=" + "x" * 10_000, "&&&", "limit=-1"]:
        requests.append(("GET", f"/v1/schedules?{query}", {}))
    assert await _sweep(client, requests) == []
    registry_requests = [("POST", "/v1/schedules", {"json": {**BODY, "workflowId": w,
                                                             "params": p}})
                         for w in ("sched-test-nightly", "sched-test-plain", "nope")
                         for p in (None, 1, {"day": []}, {"day": "x"})]
    assert await _sweep(registry_client, registry_requests) == []

