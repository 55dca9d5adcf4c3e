"""What an author meets in week one (issue 19, items 4 and 5), through real
in-process workers on Postgres: keyless signal waits, step keys that can be
named in a URL, the history of failed attempts and `Retry` reasons, and
effects retried with the same idempotency key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.authors import keyflows
from tests.support.admission import admit
from tests.support.history import events_of, step_rows
from tests.support.timing import quick_settings
from tests.support.waiting import wait_status
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.authors.keyflows"])


@pytest.fixture
def author_settings(database_url: str) -> Settings:
    return quick_settings(database_url, redelivery_cap_seconds=0.2,
                          max_unacknowledged_deliveries=3)


@pytest.fixture
def store_settings(author_settings: Settings) -> Settings:
    return author_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture
def store(store: ExecutionStore) -> ExecutionStore:
    keyflows.CALLS.clear()  # each test counts its own calls
    return store


@pytest_asyncio.fixture
async def workers(author_settings, store) -> AsyncIterator[InProcessWorkers]:
    group = InProcessWorkers(author_settings, WORKFLOWS)
    try:
        yield group
    finally:
        await group.stop_all()


# ------------------------------------------------------------------ keys


async def test_repeated_keyless_signal_waits_get_a_sequence_of_keys(store, pool, workers):
    await workers.start()
    eid = await admit(store, "author-items", "items-1", {"n": 3})
    for i in range(3):
        answer, _ = await store.signals.send_signal(eid, "item", {"i": i})
        assert answer == "received"
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["outcome"] == {"result": [{"i": 0}, {"i": 1}, {"i": 2}]}, record
    assert set(await step_rows(pool, eid)) == {"signal:item", "signal:item#2", "signal:item#3"}


@pytest.mark.parametrize("key", ["a/b", "has space", "", "x" * 201, "signal:item#2"])
async def test_a_step_key_outside_the_id_alphabet_fails_with_a_clear_error(store, workers, key):
    await workers.start()
    eid = await admit(store, "author-bad-key", f"bad-key-{len(key)}-{key.count('/')}",
                      {"key": key})
    record = await wait_status(store, eid, "failed", "completed", timeout=10)
    assert record["status"] == "failed", record
    error = record["outcome"]["error"]
    if key:
        assert error["name"] == "ValueError" and "A-Z a-z 0-9" in error["message"], error


# ------------------------------------------------------------ attempt history


async def test_failed_attempts_of_a_retried_step_are_kept(store, pool, workers):
    await workers.start()
    eid = await admit(store, "author-retried-step", "retried-1", {"fail_times": 2})
    record = await wait_status(store, eid, "completed", "failed", timeout=10)
    assert record["outcome"] == {"result": "ok after 3"}
    attempts = await store.history.attempt_history(eid)
    assert [(a["step_key"], a["attempt"], a["error"]["name"]) for a in attempts] == [
        ("call", 1, "ConnectionRefusedError"), ("call", 2, "ConnectionRefusedError")]
    assert "attempt 2" in attempts[1]["error"]["message"]
    failed = await events_of(store, eid, "attempt_failed")
    assert [e["detail"]["attempt"] for e in failed] == [1, 2]
    assert (await step_rows(pool, eid))["call"]["attempts"] == 3


async def test_the_attempt_history_of_a_step_is_bounded(store, workers):
    await workers.start()
    eid = await admit(store, "author-retried-step", "retried-many",
                      {"fail_times": 100, "attempts": 30})
    await wait_status(store, eid, "completed", "failed", timeout=15)
    attempts = await store.history.attempt_history(eid)
    # 30 attempts, all failed: the step's failure is recorded; the history
    # keeps the last 20 failed attempts.
    assert [a["attempt"] for a in attempts] == list(range(11, 31))


async def test_retry_reasons_are_kept_and_named_when_the_execution_is_parked_as_poison(
    store, workers
):
    await workers.start()
    eid = await admit(store, "author-retry-reason", "reason-1", {"times": 10})
    record = await wait_status(store, eid, "parked", timeout=15)
    assert record["parked_reason"] == "poison"
    released = await events_of(store, eid, "released")
    assert released and all(e["detail"]["reason"] == "the inventory service is in maintenance"
                            for e in released)
    attempts = await store.history.attempt_history(eid)
    assert attempts and all(a["step_key"] is None and a["error"]["name"] == "Retry"
                            for a in attempts)
    [parked] = await events_of(store, eid, "parked")
    assert "the inventory service is in maintenance" in [
        r["message"] for r in parked["detail"]["lastReasons"]]


# ------------------------------------------------------------------ effects


async def test_an_effect_retries_a_known_failure_with_the_same_key(store, pool, workers):
    await workers.start()
    eid = await admit(store, "author-effect-retry", "fx-retry-1", {"fail_times": 2})
    record = await wait_status(store, eid, "completed", "failed", "parked", timeout=10)
    assert record["outcome"]["result"] == {"charged": True, "key": f"{eid}:charge"}, record
    assert keyflows.CALLS[f"keys:{eid}:{eid}:charge"] == 3  # one key, three calls
    attempts = await store.history.attempt_history(eid)
    assert [(a["step_key"], a["attempt"]) for a in attempts] == [("charge", 1), ("charge", 2)]


async def test_steps_show_failed_attempts_and_a_completed_effect_keeps_its_key(store, workers):
    import httpx

    from app.api.app import create_app

    await workers.start()
    eid = await admit(store, "author-effect-retry", "fx-steps", {"fail_times": 1})
    await wait_status(store, eid, "completed", timeout=10)
    app = create_app(workers.settings, workflows=WORKFLOWS)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as api:
        [step] = (await api.get(f"/v1/executions/{eid}/steps")).json()["steps"]
    assert step["status"] == "completed" and step["idempotencyKey"] == f"{eid}:charge"
    assert step["startedAt"] is not None
    assert [(a["attempt"], a["name"]) for a in step["failedAttempts"]] == [(1, "RuntimeError")]
