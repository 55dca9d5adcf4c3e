"""Ownership inside the statement (issue 11, item 1).

A trigger token sees and touches only the executions it admitted, and the
owner predicate sits in the statement that reads or writes: there is no
check-then-act gap a second tenant could slip an admission into. A missing
and a foreign ID are the same 404. Request bodies are read completely before
any work is done on them, and reading a body has a timeout (408
REQUEST_TIMEOUT).

Attacks reproduced first:
  * a real uvicorn server and a raw socket: tenant B sends the headers of
    `POST /v1/executions/victim-1/wakes` and holds the body; tenant A admits
    victim-1; B sends the body. It must be 404 and nothing written.
  * a body held back past FENCEPOST_BODY_TIMEOUT_SECONDS: 408, nothing done.
  * tenant A's admission forced between the statements of B's request (a pool
    that runs A's admission after B's first statement returns): every read and
    the wake must answer 404, with nothing of A's shown or written.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from app.store import ExecutionStore, RetryingPool
from tests.support.responses import assert_error
from tests.tenancy.conftest import (
    BodyProbe,
    error_code,
    raw_connect,
    read_response,
    send_head,
)


async def execution_state(pool, eid: str) -> tuple:
    """Everything a wake or a read could change about one execution."""
    return tuple(await pool.fetchrow(
        "SELECT (SELECT count(*) FROM executions WHERE execution_id = $1), "
        "(SELECT string_agg(kind, ',' ORDER BY event_id) FROM execution_events "
        " WHERE execution_id = $1), "
        "(SELECT due_at::text || status || updated_at::text FROM executions "
        " WHERE execution_id = $1)", eid))


# -- the held-back body, on a real server --------------------------------------------

async def test_held_back_wake_body_after_the_victim_is_admitted_is_404_and_writes_nothing(
        make_server, tokens, admit_as, pool):
    probe = BodyProbe()
    server = await make_server(wrap=probe)
    path = "/v1/executions/victim-1/wakes"
    body = json.dumps({"at": "2030-01-01T00:00:00Z"}).encode()
    reader, writer = await raw_connect(server.port)
    try:
        await send_head(writer, "POST", path, tokens.b, len(body))
        # B's request is in the app, waiting for its body: everything the route
        # does before reading the body has been done.
        await probe.reading(path)
        async with server.client() as a:
            await admit_as(a, tokens.a, "victim-1")
        before = await execution_state(pool, "victim-1")
        writer.write(body)
        await writer.drain()
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert (status, error_code(answer)) == (404, "EXECUTION_NOT_FOUND"), answer
    assert await execution_state(pool, "victim-1") == before
    assert before[1] == "admitted", before  # no wake_requested event of B's


async def test_a_body_held_back_past_the_timeout_is_408_and_nothing_is_done(
        make_server, tenancy_settings, tokens, admit_as, pool):
    server = await make_server(tenancy_settings.model_copy(update={"body_timeout_seconds": 0.5}))
    async with server.client() as c:
        await admit_as(c, tokens.a, "slow-1")
    before = await execution_state(pool, "slow-1")
    for path, partial, length in (
        ("/v1/executions/slow-1/wakes", b'{"at": ', 40),   # part of the body, then nothing
        ("/v1/executions", b"", 60),                       # headers only
        ("/v1/executions/slow-1/signals/go", b"[1, ", 30),  # the signal route reads alike
    ):
        reader, writer = await raw_connect(server.port)
        started = time.monotonic()
        try:
            await send_head(writer, "POST", path, tokens.a, length)
            if partial:
                writer.write(partial)
                await writer.drain()
            status, _, answer = await read_response(reader, timeout=10)
        finally:
            writer.close()
        waited = time.monotonic() - started
        assert (status, error_code(answer)) == (408, "REQUEST_TIMEOUT"), (path, status, answer)
        message = json.loads(answer)["error"]["message"]
        assert "0.5" in message and "send" in message, message
        assert 0.4 <= waited < 5, waited
    assert await execution_state(pool, "slow-1") == before
    assert await pool.fetchval("SELECT count(*) FROM executions") == 1
    assert await pool.fetchval("SELECT count(*) FROM signals") == 0


async def test_a_body_sent_in_time_in_pieces_is_read_whole(make_server, tenancy_settings,
                                                           tokens, admit_as, pool):
    server = await make_server(tenancy_settings.model_copy(update={"body_timeout_seconds": 5}))
    async with server.client() as c:
        await admit_as(c, tokens.a, "pieces-1")
    body = json.dumps({"at": "2030-01-01T00:00:00Z"}).encode()
    reader, writer = await raw_connect(server.port)
    try:
        await send_head(writer, "POST", "/v1/executions/pieces-1/wakes", tokens.a, len(body))
        for i in range(0, len(body), 5):
            writer.write(body[i:i + 5])
            await writer.drain()
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert status == 200 and json.loads(answer) == {"status": "requested"}, answer


# -- an admission forced between the statements of one request -----------------------

class AfterFirstStatement(RetryingPool):
    """A pool that runs `hook()` once, right after the first statement of the
    request it serves returns (the gap a check-then-act route leaves)."""

    def __init__(self, pool, hook):
        super().__init__(pool.raw if isinstance(pool, RetryingPool) else pool)
        self.hook = hook
        self.statements = 0
        self.hooked = 0

    async def _after(self, value):
        self.statements += 1
        if self.statements == 1:
            await self.hook()
            self.hooked += 1
        return value

    async def execute(self, query, *args, **kw):
        return await self._after(await super().execute(query, *args, **kw))

    async def fetch(self, query, *args, **kw):
        return await self._after(await super().fetch(query, *args, **kw))

    async def fetchrow(self, query, *args, **kw):
        return await self._after(await super().fetchrow(query, *args, **kw))

    async def fetchval(self, query, *args, **kw):
        return await self._after(await super().fetchval(query, *args, **kw))


ROUTES = {
    "get": ("GET", "/v1/executions/{id}"),
    "events": ("GET", "/v1/executions/{id}/events"),
    "steps": ("GET", "/v1/executions/{id}/steps"),
    "late-observations": ("GET", "/v1/executions/{id}/late-observations"),
    "wake": ("POST", "/v1/executions/{id}/wakes"),
    "wake-with-body": ("POST", "/v1/executions/{id}/wakes"),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_an_admission_between_the_statements_of_a_foreign_request_is_not_seen(
        route, api, tokens, store, pool, tenancy_settings):
    method, path = ROUTES[route]
    eid = f"victim-{route}"

    async def tenant_a_admits() -> None:
        await store.admissions.admit(workflow_id="wf", params={"secret": "A's"}, execution_id=eid,
                          admitted_by=tokens.a.token_id)

    app = api.app
    proxy = AfterFirstStatement(app.state.store.pool, tenant_a_admits)
    app.state.store = ExecutionStore.from_settings(proxy, tenancy_settings)
    kw = {"json": {"at": "2030-01-01T00:00:00Z"}} if route == "wake-with-body" else {}
    r = await api.request(method, path.format(id=eid), headers=tokens.b.headers, **kw)
    assert proxy.hooked == 1, "tenant A's admission never ran inside B's request"
    assert_error(r, 404, "EXECUTION_NOT_FOUND")
    assert "A's" not in r.text
    kinds = await pool.fetchval(
        "SELECT string_agg(kind, ',' ORDER BY event_id) FROM execution_events "
        "WHERE execution_id = $1", eid)
    assert kinds == "admitted", kinds


# -- foreign and missing: one 404 ----------------------------------------------------

@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_foreign_and_missing_ids_answer_the_same_404(route, api, tokens, admit_as, pool):
    method, path = ROUTES[route]
    await admit_as(api, tokens.a, "mine-a")
    kw = {"json": {"at": "2030-01-01T00:00:00Z"}} if route == "wake-with-body" else {}
    before = await execution_state(pool, "mine-a")
    answers = []
    for eid in ("mine-a", "nobody-x"):
        r = await api.request(method, path.format(id=eid), headers=tokens.b.headers, **kw)
        error = assert_error(r, 404, "EXECUTION_NOT_FOUND")
        answers.append((r.status_code, set(error), error["message"].replace(eid, "ID")))
    assert answers[0] == answers[1]
    assert await execution_state(pool, "mine-a") == before
    # The owner, a read token and an operate token (reads; wakes for operate) do see it.
    for token in (tokens.a, tokens.read, tokens.operate):
        if method == "POST" and token.role == "read":
            continue
        r = await api.request(method, path.format(id="mine-a"), headers=token.headers, **kw)
        assert r.status_code == 200, (token.name, r.text)


async def test_listing_shows_a_trigger_token_only_its_own(api, tokens, admit_as):
    for i in range(3):
        await admit_as(api, tokens.a, f"a-{i}")
    await admit_as(api, tokens.b, "b-0")
    for token, expected in ((tokens.a, {"a-0", "a-1", "a-2"}), (tokens.b, {"b-0"}),
                            (tokens.read, {"a-0", "a-1", "a-2", "b-0"})):
        r = await api.get("/v1/executions", headers=token.headers)
        assert r.status_code == 200, r.text
        assert {e["executionId"] for e in r.json()["executions"]} == expected, token.name


async def test_many_held_bodies_and_admissions_race_never_crossing_tenants(
        make_server, tokens, admit_as, pool):
    """20 rounds, each: B's wake headers, A admits the ID, B's body. Then the other
    order: A admits first. Every answer to B is 404 and B never writes."""
    probe = BodyProbe()
    server = await make_server(wrap=probe)
    body = b"{}"
    answers = []
    async with server.client() as a:
        for i in range(20):
            eid = f"race-{i}"
            path = f"/v1/executions/{eid}/wakes"
            reader, writer = await raw_connect(server.port)
            try:
                await send_head(writer, "POST", path, tokens.b, len(body))
                if i % 2 == 0:
                    await probe.reading(path)
                    await admit_as(a, tokens.a, eid)
                else:
                    await admit_as(a, tokens.a, eid)
                    await probe.reading(path)
                writer.write(body)
                await writer.drain()
                status, _, answer = await asyncio.wait_for(read_response(reader), 10)
            finally:
                writer.close()
            answers.append((status, error_code(answer)))
    assert set(answers) == {(404, "EXECUTION_NOT_FOUND")}, answers
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'wake_requested'") == 0


async def _held_back(first: bytes):
    yield first
    await asyncio.sleep(2)  # the held-back rest: past the 0.2 s body timeout
    yield b"}"


@pytest.mark.parametrize("path,role", [
    ("/v1/executions", "a"),
    ("/v1/executions/held-1/wakes", "operate"),
    ("/v1/executions/held-1/signals/go", "operate"),
    ("/v1/executions/held-1/cancel", "operate"),
    ("/v1/executions/held-1/steps/charge/resolve", "operate"),
    ("/v1/executions/held-1/resume", "operate"),
    ("/v1/schedules", "operate"),
])
async def test_every_body_route_answers_a_held_back_body_with_408(path, role, make_api,
                                                                  tenancy_settings, tokens,
                                                                  admit_as, pool):
    api = await make_api(tenancy_settings.model_copy(update={"body_timeout_seconds": 0.2}))
    await admit_as(api, tokens.a, "held-1")
    before = await execution_state(pool, "held-1")
    token = getattr(tokens, role)
    started = time.monotonic()
    r = await api.post(path, content=_held_back(b'{"x": 1'),
                       headers={**token.headers, "content-type": "application/json"})
    assert_error(r, 408, "REQUEST_TIMEOUT")
    assert time.monotonic() - started < 1.5
    assert await execution_state(pool, "held-1") == before
    assert await pool.fetchval("SELECT count(*) FROM executions") == 1
