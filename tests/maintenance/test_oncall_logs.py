"""Issue 20, item 2: logs that tell the story. One line for every delivery
that ends other than completed (failed with its error name, retry with its
reason, parked with its reason), every lease takeover (old and new owner,
token), every rejected fenced write, every operator action (who, what,
which execution), every authentication failure (never the token); a request
ID returned in `X-Request-ID` and stored with the admission event; nothing
per delivery at the default level when everything completes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.api.auth import new_token
from app.reaper import LeaseReaper
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore, LeaseLost
from app.worker import Worker
from tests.support.admission import admit
from tests.support.asgi import asgi_client
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

WORKFLOWS = load_workflows(["tests.maintenance.flows"])


@pytest.fixture
def l_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, auth="disabled", workflows="",
                    lease_seconds=2, renew_seconds=0.2, poll_seconds=0.05,
                    redelivery_base_seconds=0.01, redelivery_cap_seconds=0.02,
                    max_unacknowledged_deliveries=3)


@pytest.fixture
def store_settings(l_settings: Settings) -> Settings:
    return l_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def api(l_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(l_settings, WORKFLOWS) as client:
        yield client


def lines(caplog, kind: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "kind", None) == kind]


async def run_until(store: ExecutionStore, settings: Settings, done, timeout: float = 20) -> None:
    worker = Worker(settings, WORKFLOWS, concurrency=4, worker_id="log-worker")
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(done, timeout=timeout, interval=0.05, what="the deliveries to end")
    finally:
        worker.request_stop()
        await task


async def test_each_delivery_that_does_not_complete_says_why_and_completed_ones_are_quiet(
        store: ExecutionStore, pool: asyncpg.Pool, l_settings: Settings, caplog) -> None:
    caplog.set_level(logging.INFO)
    for i in range(20):
        await admit(store, "mnt-ok", f"ok-{i}")
    await admit(store, "mnt-fails", "declined")
    await admit(store, "mnt-always-retry", "closed")

    async def settled():
        return await pool.fetchval(
            "SELECT count(*) = 0 FROM executions WHERE status NOT IN ('completed', 'failed', "
            "'parked')")
    await run_until(store, l_settings, settled)

    ends = lines(caplog, "delivery_end")
    by_execution: dict[str, list[logging.LogRecord]] = {}
    for r in ends:
        by_execution.setdefault(r.execution_id, []).append(r)
    assert set(by_execution) == {"declined", "closed"}, [r.getMessage() for r in ends]
    [failed] = by_execution["declined"]
    assert (failed.outcome, failed.error_name, failed.levelno) == (
        "failed", "PaymentDeclined", logging.WARNING)
    assert "4111" not in failed.getMessage()  # a failure's message may hold values
    retries = by_execution["closed"]
    assert [r.outcome for r in retries] == ["retry"] * 3
    assert all("the ledger is closed" in r.getMessage() for r in retries)
    assert [r.status for r in retries] == [None, None, "parked"]  # the third parks: poison
    assert "parked" in retries[-1].getMessage() and retries[-1].levelno == logging.WARNING
    # Twenty completed executions: not one line names them at the default level.
    assert not [r for r in caplog.records if "ok-" in r.getMessage()
                or str(getattr(r, "execution_id", "")).startswith("ok-")]


async def test_a_takeover_says_old_and_new_owner_and_token(
        store: ExecutionStore, pool: asyncpg.Pool, caplog) -> None:
    caplog.set_level(logging.INFO)
    for eid in ("by-claim", "by-reaper"):
        await admit(store, "mnt-ok", eid)
    await store.leases.claim_due(2, 30, "crashed")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour'")
    [taken] = await store.leases.claim_due(1, 30, "survivor")
    await LeaseReaper(store).run_once()
    records = {r.execution_id: r for r in lines(caplog, "lease_takeover")}
    assert len(lines(caplog, "lease_takeover")) == 2
    claimed = records[taken.lease.execution_id]
    assert (claimed.old_owner, claimed.new_owner, claimed.token) == ("crashed", "survivor", 1)
    other = "by-reaper" if taken.lease.execution_id == "by-claim" else "by-claim"
    reaped = records[other]
    assert (reaped.old_owner, reaped.new_owner, reaped.token) == ("crashed", None, 1)
    assert "reaper" in reaped.getMessage() and "survivor" in claimed.getMessage()


async def test_a_rejected_fenced_write_is_one_line(
        store: ExecutionStore, pool: asyncpg.Pool, l_settings: Settings, caplog) -> None:
    caplog.set_level(logging.INFO)
    await admit(store, "mnt-ok", "stale")
    [d] = await store.leases.claim_due(1, 30, "old-holder")
    await pool.execute("UPDATE executions SET token = token + 1")  # another holder now
    worker = Worker(l_settings, WORKFLOWS, concurrency=1, worker_id="w")
    worker.store = store
    await worker._write_outcome(d.lease, "completed", 1, None, None, None, None)
    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(d.lease, "completed", result=1)
    [rejected] = lines(caplog, "fenced_write_rejected")
    assert (rejected.execution_id, rejected.token) == ("stale", 1)
    assert "rejected" in rejected.getMessage()


async def test_operator_actions_say_who_what_and_which_execution(
        store: ExecutionStore, api: httpx.AsyncClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    await admit(store, "mnt-ok", "to-cancel")
    r = await api.post("/v1/executions/to-cancel/cancel", json={"by": "alice"})
    assert r.status_code in (200, 202), r.text
    r = await api.post("/v1/executions/nobody/resume", json={"by": "bob"})
    assert r.status_code == 404
    actions = [(r.action, r.by, r.execution_id, r.result)
               for r in lines(caplog, "operator_action")]
    assert actions == [("cancel", "alice", "to-cancel", "cancelled"),
                       ("resume", "bob", "nobody", "not_found")]


async def test_an_authentication_failure_is_logged_without_the_token(
        l_settings: Settings, pool: asyncpg.Pool, caplog) -> None:
    caplog.set_level(logging.INFO)
    app = create_app(l_settings.model_copy(update={"auth": "enabled"}), workflows=WORKFLOWS)
    token_id, token, _ = new_token()
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://t") as api:
            r = await api.get("/v1/executions", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 401
            assert (await api.get("/v1/executions")).status_code == 401
    failures = lines(caplog, "auth_failure")
    assert [f.reason for f in failures] == ["unknown or revoked token", "no bearer token"]
    assert failures[0].token_id == token_id and failures[0].path == "/v1/executions"
    secret = token.split("_", 2)[2]
    for record in caplog.records:
        assert secret not in record.getMessage() and secret not in str(record.__dict__)


async def test_the_request_id_is_returned_and_stored_with_the_admission(
        api: httpx.AsyncClient, pool: asyncpg.Pool, caplog) -> None:
    body = {"workflowId": "mnt-ok", "params": {}, "executionId": "traced"}
    r = await api.post("/v1/executions", json=body, headers={"X-Request-ID": "req-42.a"})
    assert r.status_code == 201 and r.headers["x-request-id"] == "req-42.a", r.headers
    detail = await pool.fetchval("SELECT detail FROM execution_events WHERE execution_id = "
                                 "'traced' AND kind = 'admitted'")
    assert detail == {"workflowId": "mnt-ok", "requestId": "req-42.a"}
    # No usable ID given (none, or not a plain short token): a new one.
    for headers in ({}, {"X-Request-ID": "x" * 500}, {"X-Request-ID": "a b"}):
        r = await api.get("/v1/executions/nope", headers=headers)
        generated = r.headers["x-request-id"]
        assert len(generated) == 32 and generated not in headers.values(), generated
    first = (await api.get("/healthz")).headers["x-request-id"]
    assert (await api.get("/healthz")).headers["x-request-id"] != first
