"""GET /v1/executions/{id}/history on the real app with authentication on:
the read role reads any execution's history, a trigger token only those it
admitted (another's reads exactly like a missing one: 404), and the
document is the one the replay check runs against."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import pytest_asyncio

from app.api.auth import new_token
from app.replay import replay
from app.settings import Settings
from app.store import ExecutionStore
from tests.replay import variants
from tests.replay.conftest import WORKFLOWS, definition, sleeping_on_nap
from tests.support.asgi import asgi_client
from tests.support.responses import assert_error
from tests.support.waiting import wait_until
from tests.support.workers import InProcessWorkers


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def store_settings(replay_settings: Settings) -> Settings:
    return replay_settings.model_copy(update={"auth": "enabled"})


@pytest_asyncio.fixture
async def api(store_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(store_settings, WORKFLOWS, raise_app_exceptions=False) as client:
        yield client


@pytest.fixture
def make_token(store: ExecutionStore) -> Callable:
    async def make(role: str, name: str) -> str:
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=name, role=role, secret_sha256=digest)
        return token

    return make


async def test_history_by_role_and_owner(api, store, workers: InProcessWorkers,
                                         make_token) -> None:
    alice, bob = await make_token("trigger", "alice"), await make_token("trigger", "bob")
    reader = await make_token("read", "ci")
    for eid, token in (("a-1", alice), ("b-1", bob)):
        r = await api.post("/v1/executions", headers=bearer(token),
                           json={"workflowId": "rp-order", "executionId": eid, "params": {"n": 2}})
        assert r.status_code == 201, r.text
    await workers.start()
    for eid in ("a-1", "b-1"):
        await wait_until(lambda eid=eid: sleeping_on_nap(store, eid), timeout=20,
                         what=f"{eid} sleeps on nap")
    await workers.stop_all()

    r = await api.get("/v1/executions/a-1/history", headers=bearer(reader))
    assert r.status_code == 200, r.text
    document = r.json()
    # The same document the store exports (times as JSON writes them).
    exported = json.loads(json.dumps(await store.exports.export("a-1"), default=str))
    for step in exported["steps"] + document["steps"]:
        step["recordedAt"] = step["recordedAt"][:19]
    assert document == exported
    assert [s["key"] for s in document["steps"]] == [
        "reserve", "charge", "book", "kid", "kid-done", "nap"]
    report = await replay(definition(variants.recorded), r.json(), WORKFLOWS)
    assert (report.ok, report.end, report.replayed) == (True, "frontier", 6)

    mine = await api.get("/v1/executions/a-1/history", headers=bearer(alice))
    assert mine.status_code == 200 and mine.json()["executionId"] == "a-1", mine.text
    theirs = await api.get("/v1/executions/b-1/history", headers=bearer(alice))
    ghost = await api.get("/v1/executions/nobody/history", headers=bearer(alice))
    assert_error(theirs, 404, "EXECUTION_NOT_FOUND")
    assert_error(ghost, 404, "EXECUTION_NOT_FOUND")
    assert theirs.json()["error"]["message"].replace("b-1", "X") == \
        ghost.json()["error"]["message"].replace("nobody", "X")
    assert_error(await api.get("/v1/executions/nobody/history", headers=bearer(reader)),
                 404, "EXECUTION_NOT_FOUND")
    assert_error(await api.get("/v1/executions/a-1/history"), 401, "UNAUTHENTICATED")
    assert_error(await api.get("/v1/executions/a-1/history", params={"nope": "1"},
                               headers=bearer(reader)), 422, "UNKNOWN_QUERY_PARAMETER")
