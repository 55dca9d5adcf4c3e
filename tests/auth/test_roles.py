"""Bearer tokens and roles against the real app (FENCEPOST_AUTH=enabled):
401 without a valid token, 403 for the wrong role, each in the one error
shape; trigger tokens see only what they admitted; operator decisions are
recorded under the token's name; health stays open; auth is on by default."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import ValidationError

from app.api import auth as auth_module
from app.settings import Settings
from app.store import Admitted, ExecutionStore
from tests.auth.conftest import headers
from tests.support.responses import JSON, assert_error

# One request per route: (method, path, kwargs).
ADMIT = ("POST", "/v1/executions", {"json": {"workflowId": "wf", "params": {}}})
LIST = ("GET", "/v1/executions", {})
GET = ("GET", "/v1/executions/{id}", {})
WAKE = ("POST", "/v1/executions/{id}/wakes", {})
SIGNAL = ("POST", "/v1/executions/{id}/signals/go", {"content": b"{}", "headers": JSON})
EVENTS = ("GET", "/v1/executions/{id}/events", {})
STEPS = ("GET", "/v1/executions/{id}/steps", {})
LATE = ("GET", "/v1/executions/{id}/late-observations", {})
CANCEL = ("POST", "/v1/executions/{id}/cancel", {})
TERMINATE = ("POST", "/v1/executions/{id}/terminate", {})
REDRIVE = ("POST", "/v1/executions/{id}/redrive", {})
FORK = ("POST", "/v1/executions/{id}/fork", {"json": {"fromStep": "charge"}})
BULK = ("POST", "/v1/operations", {"json": {"action": "cancel", "filter": {"workflowId": "none"}}})
BULK_GET = ("GET", "/v1/operations/op-0000000000000000", {})
RESOLVE = ("POST", "/v1/executions/{id}/steps/charge/resolve",
           {"json": {"action": "retry"}})
RESUME = ("POST", "/v1/executions/{id}/resume", {})
WORKERS = ("GET", "/v1/workers", {})
METRICS = ("GET", "/metrics", {})

ROUTES = {
    "admit": ADMIT, "list": LIST, "get": GET, "wake": WAKE, "signal": SIGNAL,
    "events": EVENTS, "steps": STEPS, "late": LATE, "cancel": CANCEL,
    "terminate": TERMINATE, "redrive": REDRIVE, "fork": FORK, "bulk": BULK,
    "bulk-get": BULK_GET, "resolve": RESOLVE,
    "resume": RESUME, "workers": WORKERS, "metrics": METRICS,
}

FORBIDDEN = {
    "trigger": {"cancel", "terminate", "bulk", "bulk-get", "resolve", "resume", "workers",
                "metrics"},
    "read": {"admit", "wake", "signal", "cancel", "terminate", "redrive", "fork", "bulk",
             "bulk-get", "resolve", "resume"},
    "operate": {"admit"},
}


async def call(api: httpx.AsyncClient, route, eid: str, token: str | None = None,
               extra_headers: dict | None = None) -> httpx.Response:
    method, path, kw = route
    kw = dict(kw)
    hdrs = dict(kw.pop("headers", {}))
    if token is not None:
        hdrs.update(headers(token))
    hdrs.update(extra_headers or {})
    return await api.request(method, path.format(id=eid), headers=hdrs, **kw)


def assert_unauthenticated(r: httpx.Response) -> None:
    assert_error(r, 401, "UNAUTHENTICATED")
    assert r.headers.get("www-authenticate") == "Bearer", r.headers


async def admitted(store: ExecutionStore, eid: str, owner_token: str | None = None,
                   workflow_id: str = "wf", **kw) -> str:
    token_id = owner_token.split("_")[1] if owner_token else None
    answer = await store.admissions.admit(workflow_id=workflow_id, params={}, execution_id=eid,
                               admitted_by=token_id, **kw)
    assert isinstance(answer, Admitted), answer
    return eid


async def snapshot(pool) -> tuple:
    return tuple(await pool.fetchrow(
        "SELECT (SELECT count(*) FROM executions), (SELECT count(*) FROM execution_events), "
        "(SELECT count(*) FROM signals), "
        "(SELECT string_agg(execution_id || status || coalesce(due_at::text, ''), ',' "
        "        ORDER BY execution_id) FROM executions)"
    ))


# --------------------------------------------------------------------------- 401


BAD_AUTHORIZATION: dict[str, str | bytes | None] = {
    "no header": None,
    "empty": "",
    "scheme only": "Bearer",
    "scheme and spaces": "Bearer    ",
    "basic": "Basic b3BzOnNlY3JldA==",
    "token without scheme": "fp_0123456789ab_secret",
    "not ours": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig",
    "two parts": "Bearer fp_0123456789ab",
    "empty id": "Bearer fp__secret",
    "empty secret": "Bearer fp_0123456789ab_",
    "wrong prefix": "Bearer xx_0123456789ab_secret",
    "unknown id": "Bearer fp_0123456789ab_" + "A" * 43,
    "very long": "Bearer fp_" + "a" * 5000 + "_" + "b" * 5000,
    "latin-1": "Bearer fp_\u00e9\u00e9_\u00ff".encode("latin-1"),
}


@pytest.mark.parametrize("route", list(ROUTES), ids=list(ROUTES))
async def test_every_route_needs_a_token(api, store, route) -> None:
    await admitted(store, "e1")
    r = await call(api, ROUTES[route], "e1")
    assert_unauthenticated(r)
    assert "fencepost tokens create" in r.json()["error"]["message"]


async def test_malformed_and_unknown_tokens_are_401(api, store, pool, make_token) -> None:
    await admitted(store, "e1")
    good = await make_token("operate", "ops")
    wrong_secret = good.rsplit("_", 1)[0] + "_" + "B" * 43
    cases = {**BAD_AUTHORIZATION, "wrong secret": f"Bearer {wrong_secret}",
             "secret of another token": "Bearer fp_0123456789ab_" + good.split("_", 2)[2]}
    before = await snapshot(pool)
    for what, value in cases.items():
        for route in (ADMIT, GET, CANCEL, METRICS):
            extra = {} if value is None else {"Authorization": value}
            r = await call(api, route, "e1", extra_headers=extra)
            assert r.status_code == 401, (what, route, r.status_code, r.text)
            assert_unauthenticated(r)
    assert await snapshot(pool) == before
    # The good one, spelt with a lower-case scheme and surrounding spaces, works.
    r = await api.get("/v1/executions/e1", headers={"Authorization": f"bearer  {good} "})
    assert r.status_code == 200, r.text


async def test_nul_and_control_bytes_in_the_token_are_401_not_500(api) -> None:
    """Header bytes arrive as latin-1 text; a NUL in the token ID must not reach
    Postgres (text cannot hold it) as a 500."""
    for raw in (b"Bearer fp_\x00_x", b"Bearer fp_ab\x00cd_x", b"Bearer fp_\x7f\x01_\xff"):
        status, body, hdrs = await raw_request(api.app, b"/v1/executions", [(b"authorization", raw)])
        assert status == 401, (raw, status, body)
        assert dict(hdrs).get(b"www-authenticate") == b"Bearer"


async def raw_request(app, path: bytes, extra_headers: list[tuple[bytes, bytes]]):
    """One request through the ASGI interface itself (httpx refuses NUL in headers)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path.decode(), "raw_path": path, "root_path": "",
        "query_string": b"", "headers": [(b"host", b"fencepost.test"), *extra_headers],
        "client": ("127.0.0.1", 1), "server": ("fencepost.test", 80),
    }
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    try:
        await app(scope, receive, send)
    except Exception as exc:  # what a server would turn into a 500
        return 500, repr(exc).encode(), []
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, start.get("headers", [])


async def test_revocation_takes_effect_within_the_cache_window(api, store, make_token,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(auth_module, "AUTH_CACHE_SECONDS", 0.3)
    token = await make_token("read", "soon-gone")
    assert (await api.get("/v1/executions", headers=headers(token))).status_code == 200
    assert await store.tokens.revoke_token("soon-gone") == 1
    await asyncio.sleep(0.4)  # past the 0.3 s cache window: the passing time is the subject
    assert_unauthenticated(await api.get("/v1/executions", headers=headers(token)))


async def test_revoked_token_is_refused_by_a_fresh_api_at_once(api, make_api, store,
                                                               make_token) -> None:
    token = await make_token("operate", "ops")
    assert (await api.get("/v1/workers", headers=headers(token))).status_code == 200
    await store.tokens.revoke_token(token.split("_")[1])
    # The running API may accept it for at most AUTH_CACHE_SECONDS more; a new one never.
    fresh = await make_api()
    assert_unauthenticated(await fresh.get("/v1/workers", headers=headers(token)))
    assert auth_module.AUTH_CACHE_SECONDS <= 10


async def test_a_refusal_is_cached_no_longer_than_the_window(api, store, monkeypatch) -> None:
    monkeypatch.setattr(auth_module, "AUTH_CACHE_SECONDS", 0.3)
    token_id, token, digest = auth_module.new_token()
    assert_unauthenticated(await api.get("/v1/executions", headers=headers(token)))
    await store.tokens.create_token(token_id, name="late", role="read", secret_sha256=digest)
    await asyncio.sleep(0.4)  # past the 0.3 s cache window: the passing time is the subject
    r = await api.get("/v1/executions", headers=headers(token))
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- 403


@pytest.mark.parametrize("role", ["trigger", "read", "operate"])
async def test_wrong_role_is_403_and_changes_nothing(api, store, pool, make_token, role) -> None:
    token = await make_token(role, f"{role}-token")
    eid = await admitted(store, "e1", owner_token=token)
    before = await snapshot(pool)
    for name in sorted(FORBIDDEN[role]):
        r = await call(api, ROUTES[name], eid, token)
        error = assert_error(r, 403, "FORBIDDEN")
        assert role in error["message"] and f"{role}-token" in error["message"], error
        assert "www-authenticate" not in r.headers
    assert await snapshot(pool) == before
    # Everything else is allowed (whatever the outcome of the request itself).
    for name in sorted(set(ROUTES) - FORBIDDEN[role]):
        r = await call(api, ROUTES[name], eid, token)
        assert r.status_code not in (401, 403), (role, name, r.status_code, r.text)


async def test_forbidden_comes_before_the_body_is_read(api, make_token) -> None:
    reader = await make_token("read", "dash")
    r = await api.post("/v1/executions", content=b"{not json", headers={**JSON, **headers(reader)})
    assert_error(r, 403, "FORBIDDEN")
    r = await api.post("/v1/executions", content=b"x" * 10_000_000,
                       headers={**JSON, **headers(reader)})
    assert_error(r, 403, "FORBIDDEN")


async def test_roles_do_what_they_may(api, store, make_token) -> None:
    trigger = await make_token("trigger", "shop")
    reader = await make_token("read", "dash")
    ops = await make_token("operate", "ops")
    r = await api.post("/v1/executions", json={"workflowId": "wf", "executionId": "t1"},
                       headers=headers(trigger))
    assert r.status_code == 201, r.text
    assert (await api.post("/v1/executions/t1/wakes", headers=headers(trigger))).status_code == 200
    r = await api.post("/v1/executions/t1/signals/go", json={"a": 1}, headers=headers(trigger))
    assert r.status_code == 202, r.text
    for token in (trigger, reader, ops):
        assert (await api.get("/v1/executions/t1", headers=headers(token))).status_code == 200
        assert (await api.get("/v1/executions/t1/events",
                              headers=headers(token))).status_code == 200
    for token in (reader, ops):
        r = await api.get("/metrics", headers=headers(token))
        assert r.status_code == 200 and "fencepost_" in r.text, r.text
        assert (await api.get("/v1/workers", headers=headers(token))).status_code == 200
    r = await api.post("/v1/executions/t1/signals/go", json=1, headers=headers(ops))
    assert r.status_code == 202, r.text
    r = await api.post("/v1/executions/t1/cancel", headers=headers(ops))
    assert r.status_code == 202 and r.json() == {"status": "cancelled"}, r.text


# ------------------------------------------------------------- trigger ownership


async def test_trigger_token_sees_only_what_it_admitted(api, store, pool, make_token) -> None:
    alice = await make_token("trigger", "alice")
    bob = await make_token("trigger", "bob")
    reader = await make_token("read", "dash")
    for i in range(3):
        r = await api.post("/v1/executions", json={"workflowId": "wf", "executionId": f"a{i}"},
                           headers=headers(alice))
        assert r.status_code == 201, r.text
    r = await api.post("/v1/executions", json={"workflowId": "wf", "executionId": "b0"},
                       headers=headers(bob))
    assert r.status_code == 201, r.text
    await admitted(store, "anon")  # admitted by no token (e.g. before auth was on)

    # Reads of another's execution answer exactly as for one that does not exist.
    for route in (GET, EVENTS, STEPS, LATE, WAKE, SIGNAL):
        before = await snapshot(pool)
        for eid in ("b0", "anon"):
            theirs = await call(api, route, eid, alice)
            ghost = await call(api, route, "no-such-id", alice)
            assert_error(theirs, 404, "EXECUTION_NOT_FOUND")
            assert_error(ghost, 404, "EXECUTION_NOT_FOUND")
            assert theirs.json()["error"]["message"].replace(eid, "X") == \
                ghost.json()["error"]["message"].replace("no-such-id", "X")
        assert await snapshot(pool) == before, route
        mine = await call(api, route, "a0", alice)
        assert mine.status_code < 300, (route, mine.status_code, mine.text)

    # Listing is filtered, across pages and filters.
    seen, cursor = [], None
    while True:
        params = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        page = (await api.get("/v1/executions", params=params, headers=headers(alice))).json()
        seen += [e["executionId"] for e in page["executions"]]
        cursor = page["nextCursor"]
        if not cursor:
            break
    assert sorted(seen) == ["a0", "a1", "a2"]
    r = await api.get("/v1/executions", params={"status": "admitted", "workflowId": "wf"},
                      headers=headers(bob))
    assert [e["executionId"] for e in r.json()["executions"]] == ["b0"]
    r = await api.get("/v1/executions", headers=headers(reader))
    assert sorted(e["executionId"] for e in r.json()["executions"]) == \
        ["a0", "a1", "a2", "anon", "b0"]


async def test_trigger_conflict_does_not_reveal_anothers_execution(api, make_token) -> None:
    alice = await make_token("trigger", "alice")
    bob = await make_token("trigger", "bob")
    body = {"workflowId": "secret-flow", "executionId": "order-42"}
    assert (await api.post("/v1/executions", json=body,
                           headers=headers(alice))).status_code == 201
    # Alice retrying learns what she already knows.
    mine = assert_error(await api.post("/v1/executions", json=body, headers=headers(alice)),
                        409, "EXECUTION_ID_CONFLICT")
    assert mine["status"] == "admitted" and mine["workflowId"] == "secret-flow", mine
    # Bob learns only that the ID is taken: not its workflow, nor its status.
    theirs = assert_error(await api.post("/v1/executions", json={**body, "workflowId": "x"},
                                         headers=headers(bob)), 409, "EXECUTION_ID_CONFLICT")
    assert "status" not in theirs and "workflowId" not in theirs, theirs
    assert "secret-flow" not in theirs["message"] and "admitted" not in theirs["message"], theirs


# ------------------------------------------------- decisions recorded as the token


async def _parked_poison(pool, settings: Settings, eid: str) -> None:
    store = ExecutionStore.from_settings(
        pool, settings.model_copy(update={"max_unacknowledged_deliveries": 1}))
    await admitted(store, eid, workflow_id=f"wf-{eid}")
    [delivery] = await store.leases.claim_due(1, 30, "w", [f"wf-{eid}"])
    await store.leases.release(delivery.lease)
    assert (await store.history.get(eid))["status"] == "parked"


async def _parked_outcome_unknown(store: ExecutionStore, eid: str, step: str) -> None:
    await admitted(store, eid, workflow_id=f"wf-{eid}")
    [delivery] = await store.leases.claim_due(1, 30, "w", [f"wf-{eid}"])
    await store.effects.begin_effect(delivery.lease, step, idempotency_key=f"{eid}-{step}",
                             function_name="charge")
    await store.effects.park_outcome_unknown(delivery.lease, step)
    assert (await store.history.get(eid))["parked_reason"] == "outcome_unknown"


async def test_operator_decisions_are_recorded_as_the_tokens_name(api, store, pool,
                                                                  auth_settings,
                                                                  make_token) -> None:
    ops = await make_token("operate", "ops-alice")
    await admitted(store, "c1")
    await _parked_poison(pool, auth_settings, "p1")
    await _parked_outcome_unknown(store, "u1", "charge")

    # A `by` in the body does not override who the token is.
    r = await api.post("/v1/executions/c1/cancel", json={"by": "mallory"}, headers=headers(ops))
    assert r.status_code == 202, r.text
    r = await api.post("/v1/executions/p1/resume", json={"by": "mallory"}, headers=headers(ops))
    assert r.status_code == 200, r.text
    r = await api.post("/v1/executions/u1/steps/charge/resolve",
                       json={"action": "succeed", "result": {"ok": True}, "by": "mallory"},
                       headers=headers(ops))
    assert r.status_code == 200, r.text

    decisions = await pool.fetch(
        "SELECT execution_id, kind, detail FROM execution_events "
        "WHERE kind IN ('cancel_requested', 'cancelled', 'resumed', 'resolved') "
        "ORDER BY event_id")
    assert [(d["execution_id"], d["kind"]) for d in decisions] == [
        ("c1", "cancel_requested"), ("c1", "cancelled"), ("p1", "resumed"), ("u1", "resolved")]
    assert {d["detail"]["by"] for d in decisions} == {"ops-alice"}, decisions
    record = (await api.get("/v1/executions/c1", headers=headers(ops))).json()
    assert "ops-alice" in record["outcome"]["error"]["message"], record
    assert "mallory" not in str(record)
    events = (await api.get("/v1/executions/u1/events", headers=headers(ops))).json()["events"]
    assert [e["detail"]["by"] for e in events if e["kind"] == "resolved"] == ["ops-alice"]


# ------------------------------------------------------------- open endpoints, default


async def test_health_is_open_without_a_token(api) -> None:
    r = await api.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = await api.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready", r.text
    # An invalid token on an open endpoint is ignored, not refused.
    assert (await api.get("/healthz", headers={"Authorization": "Bearer nope"})).status_code == 200


def test_auth_is_enabled_when_the_variable_is_unset(monkeypatch) -> None:
    monkeypatch.delenv("FENCEPOST_AUTH", raising=False)
    assert Settings(database_url="postgresql://x/y").auth == "enabled"
    monkeypatch.setenv("FENCEPOST_AUTH", "disabled")
    assert Settings(database_url="postgresql://x/y").auth == "disabled"
    monkeypatch.setenv("FENCEPOST_AUTH", "off")
    with pytest.raises(ValidationError):
        Settings(database_url="postgresql://x/y")


async def test_an_api_started_without_the_variable_requires_tokens(database_url, make_api,
                                                                   monkeypatch) -> None:
    monkeypatch.delenv("FENCEPOST_AUTH", raising=False)
    api = await make_api(Settings(database_url=database_url, workflows=""))
    assert_unauthenticated(await api.get("/v1/executions"))
    assert (await api.get("/healthz")).status_code == 200


async def test_auth_disabled_acts_as_anonymous_operator(settings, make_api) -> None:
    api = await make_api(settings.model_copy(update={"auth": "disabled", "workflows": ""}))
    r = await api.post("/v1/executions", json={"workflowId": "wf", "executionId": "d1"})
    assert r.status_code == 201, r.text
    r = await api.post("/v1/executions/d1/cancel", json={"by": "carol"})
    assert r.status_code == 202, r.text
    events = (await api.get("/v1/executions/d1/events")).json()["events"]
    assert {e["detail"].get("by") for e in events if e["kind"] == "cancelled"} == {"carol"}


async def test_a_trigger_token_redrives_and_forks_only_its_own(api, store, make_token) -> None:
    mine, theirs = await make_token("trigger", "shop"), await make_token("trigger", "other")
    eid = await admitted(store, "own-1", owner_token=theirs)
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.steps.write_step(d.lease, "charge", value=1, function_name="f", attempts=1)
    await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})
    for route in (REDRIVE, FORK):
        assert_error(await call(api, route, eid, mine), 404, "EXECUTION_NOT_FOUND")
    assert (await store.history.get(eid))["status"] == "failed"
    assert (await call(api, FORK, eid, theirs)).status_code == 201
    r = await call(api, REDRIVE, eid, theirs)
    assert r.status_code == 202 and r.json()["status"] == "admitted", r.text
