"""Issue 20, item 1: each metric on-call reads is moved by a test that causes
it, on a real database: a lease takeover counted once whichever of the claim
and the reaper ends it; terminal transitions whoever writes them (worker
acknowledgement, reaper, deadline sweep, API cancel); parks by reason; the
`blockedBy` breakdown per workflow by the API's own rule; the backlog age over
executions waiting for a worker only; database up/down; HTTP metrics;
labelled counters at zero before their first event; no `_created` series."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.blocked import REASONS
from app.metrics import METRICS
from app.reaper import LeaseReaper
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.version import VERSION
from app.worker import Worker
from tests.support.admission import admitting
from tests.support.asgi import asgi_client

pytestmark = pytest.mark.timeout(60)

WORKFLOWS = load_workflows(["tests.maintenance.flows"])


def sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name}{labels} missing from:\n{text}"
    return float(found.group(1))


def local(name: str, labels: str = "") -> float:
    return sample(METRICS.render().decode(), name, labels)


@pytest.fixture
def m_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, auth="disabled", workflows="",
                    redelivery_base_seconds=0.05, redelivery_cap_seconds=0.05)


@pytest.fixture
def store_settings(m_settings: Settings) -> Settings:
    return m_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def api(m_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(m_settings, WORKFLOWS) as client:
        yield client


async def scrape(api: httpx.AsyncClient) -> str:
    r = await api.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


admit = admitting("mnt-ok")


async def expire(pool: asyncpg.Pool, eid: str) -> None:
    """The holder stopped renewing an hour ago (its redelivery delay has passed)."""
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                       "WHERE execution_id = $1", eid)


TAKEN_BY_CLAIM = 'fencepost_lease_takeovers_total{by="claim"}'
TAKEN_BY_REAPER = 'fencepost_lease_takeovers_total{by="reaper"}'


def takeovers() -> tuple[float, float]:
    return local(TAKEN_BY_CLAIM), local(TAKEN_BY_REAPER)


async def test_an_expired_lease_ended_by_the_reaper_counts_once(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    await admit(store, "dead-holder")
    await store.leases.claim_due(1, 30, "killed-worker")
    await expire(pool, "dead-holder")
    claim0, reaper0 = takeovers()
    reaper = LeaseReaper(store)
    assert (await reaper.run_once()).expired == 1
    assert (await reaper.run_once()).expired == 0
    [taken] = await store.leases.claim_due(1, 30, "survivor")  # after the reaper: a plain claim
    assert not taken.taken_over
    assert takeovers() == (claim0, reaper0 + 1)


async def test_an_expired_lease_taken_over_by_a_claim_counts_once(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    await admit(store, "dead-holder")
    await store.leases.claim_due(1, 30, "killed-worker")
    await expire(pool, "dead-holder")
    claim0, reaper0 = takeovers()
    [taken] = await store.leases.claim_due(1, 30, "survivor")
    assert taken.taken_over
    assert (await LeaseReaper(store).run_once()).expired == 0  # nothing left for it
    assert takeovers() == (claim0 + 1, reaper0)


def ended(status: str) -> float:
    return local("fencepost_terminal_transitions_total", f'{{status="{status}"}}')


def parks(reason: str) -> float:
    return local("fencepost_parks_total", f'{{reason="{reason}"}}')


async def test_terminal_transitions_count_whoever_writes_them(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    before = {s: ended(s) for s in ("completed", "failed", "cancelled", "timed_out")}
    parks0 = {r: parks(r) for r in ("poison", "outcome_unknown")}
    for eid in ("done", "broken", "doubt", "held-cancel"):
        await admit(store, eid)
    leases = {d.lease.execution_id: d.lease for d in await store.leases.claim_due(10, 30, "w")}
    # The worker's acknowledgements.
    await store.leases.acknowledge(leases["done"], "completed", result=1)
    await store.leases.acknowledge(leases["broken"], "failed", error={"name": "E", "message": "m"})
    await store.effects.park_outcome_unknown(leases["doubt"], "charge")
    # The API's cancel of an execution nobody holds: cancelled at once.
    await admit(store, "unheld")
    r = await api.post("/v1/executions/unheld/cancel", json={})
    assert r.status_code in (200, 202) and r.json()["status"] == "cancelled", r.text
    # A held one: only requested; its holder's acknowledgement writes the end.
    r = await api.post("/v1/executions/held-cancel/cancel", json={})
    assert r.json()["status"] == "running", r.text
    assert ended("cancelled") == before["cancelled"] + 1
    await store.leases.acknowledge(leases["held-cancel"], "completed", result=1)
    # The deadline sweep.
    await admit(store, "late", timeout_seconds=3600)
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 second' "
                       "WHERE execution_id = 'late'")
    assert await store.leases.sweep_interrupted() == ["late"]
    # The reaper (through release's rules): the poison threshold.
    poison_store = ExecutionStore(pool, redelivery_base_seconds=0.05,
                                  redelivery_cap_seconds=0.05, max_unacknowledged_deliveries=1)
    await admit(store, "poison")
    [p] = await poison_store.leases.claim_due(1, 30, "w", ["mnt-ok"])
    await poison_store.leases.release(p.lease)

    assert local("fencepost_end_to_end_duration_seconds_count", '{workflow="mnt-ok"}') >= 2
    assert {s: ended(s) - before[s] for s in before} == {
        "completed": 1, "failed": 1, "cancelled": 2, "timed_out": 1}
    assert {r: parks(r) - parks0[r] for r in parks0} == {"poison": 1, "outcome_unknown": 1}
    # The API serves its own process's counters with the database gauges.
    text = await scrape(api)
    assert sample(text, "fencepost_terminal_transitions_total", '{status="cancelled"}') == \
        ended("cancelled")


async def test_waiting_executions_by_reason_and_workflow_follow_the_apis_rule(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    for eid in ("a-held", "a-signal", "a-due", "a-waits"):
        await admit(store, eid)
    leases = {d.lease.execution_id: d.lease for d in await store.leases.claim_due(3, 30, "w")}
    assert set(leases) == {"a-held", "a-signal", "a-due"}
    await store.leases.acknowledge(leases["a-signal"], "suspended", waiting_on={"signal": "go"})
    await store.leases.release(leases["a-due"])  # redelivery delay, then due
    await pool.execute("UPDATE executions SET redeliver_after = now() + interval '1 hour' "
                       "WHERE execution_id = 'a-due'")
    await admit(store, "b-1", workflow_id="mnt-retry-once")
    await admit(store, "b-2", workflow_id="mnt-retry-once")
    await store.workers.register_worker("w-ok", host="h", pid=1, workflows=["mnt-ok"], concurrency=3)

    items = (await api.get("/v1/executions", params={"limit": 100})).json()["executions"]
    expected = Counter((e["blockedBy"]["reason"], e["workflowId"])
                       for e in items if e["blockedBy"] is not None)
    assert expected == {("leased", "mnt-ok"): 1, ("waiting-for-signal", "mnt-ok"): 1,
                        ("redelivery-delay", "mnt-ok"): 1, ("due", "mnt-ok"): 1,
                        ("no-worker", "mnt-retry-once"): 2}
    text = await scrape(api)
    for reason in REASONS:
        if reason == "none":
            continue
        for workflow in WORKFLOWS:  # every reason of every workflow, 0 included
            assert sample(text, "fencepost_waiting_executions",
                          f'{{reason="{reason}",workflow="{workflow}"}}') == \
                expected.get((reason, workflow), 0), (reason, workflow)
    assert sample(text, "fencepost_executions", '{status="running",workflow="mnt-ok"}') == 1
    assert sample(text, "fencepost_executions",
                  '{status="admitted",workflow="mnt-retry-once"}') == 2
    assert sample(text, "fencepost_executions", '{status="parked",workflow="mnt-fails"}') == 0
    assert sample(text, "fencepost_live_workers") == 1
    assert sample(text, "fencepost_live_worker_capacity") == 3
    assert sample(text, "fencepost_database_up") == 1


async def test_the_backlog_age_counts_only_executions_waiting_for_a_worker(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await admit(store, "retrying")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.leases.release(d.lease)
    # Due for a minute, but sitting out a redelivery delay for an hour more.
    await pool.execute("UPDATE executions SET due_at = now() - interval '60 seconds', "
                       "updated_at = now() - interval '60 seconds', "
                       "redeliver_after = now() + interval '1 hour'")
    text = await scrape(api)
    assert sample(text, "fencepost_oldest_due_age_seconds") == 0
    assert 59 < sample(text, "fencepost_oldest_waiting_age_seconds",
                       '{reason="redelivery-delay"}') < 120
    await pool.execute("UPDATE executions SET redeliver_after = NULL")  # now it waits
    text = await scrape(api)
    assert 59 < sample(text, "fencepost_oldest_due_age_seconds") < 120
    assert sample(text, "fencepost_oldest_waiting_age_seconds", '{reason="no-worker"}') > 59


async def test_a_database_that_does_not_answer_is_database_up_0_not_a_failed_scrape(
        database_url: str, pool: asyncpg.Pool) -> None:
    settings = Settings(database_url=database_url, auth="disabled", workflows="",
                        statement_timeout_seconds=0.3)
    async with asgi_client(settings, {}) as api:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE executions IN ACCESS EXCLUSIVE MODE")
            text = await scrape(api)
        assert sample(text, "fencepost_database_up") == 0
        assert "fencepost_build_info" in text  # the process's own metrics still served
        assert sample(await scrape(api), "fencepost_database_up") == 1


async def test_the_exposition_has_http_build_process_metrics_and_no_created_series(
        api: httpx.AsyncClient) -> None:
    route = 'method="GET",route="/v1/executions/{execution_id}",status="404"'
    text = await scrape(api)
    # Labelled counters exist at zero before their first event.
    base = sample(text, "fencepost_http_requests_total", "{" + route + "}")
    for status in ("completed", "failed", "cancelled", "timed_out"):
        sample(text, "fencepost_terminal_transitions_total", f'{{status="{status}"}}')
    for outcome in ("completed", "failed", "retry", "park", "stopped"):
        sample(text, "fencepost_deliveries_total", f'{{outcome="{outcome}",workflow="mnt-ok"}}')
    assert (await api.get("/v1/executions/nope")).status_code == 404
    text = await scrape(api)
    assert sample(text, "fencepost_http_requests_total", "{" + route + "}") == base + 1
    assert sample(text, "fencepost_http_request_duration_seconds_count",
                  '{method="GET",route="/v1/executions/{execution_id}"}') >= 1
    assert sample(text, "fencepost_build_info", f'{{version="{VERSION}"}}') == 1
    assert sample(text, "process_cpu_seconds_total") > 0
    assert "_created" not in text


async def test_a_worker_reports_its_capacity_and_in_flight(m_settings: Settings) -> None:
    Worker(m_settings, WORKFLOWS, concurrency=7)
    assert local("fencepost_worker_capacity") == 7
    assert local("fencepost_worker_in_flight_deliveries") >= 0
    assert local("fencepost_deliveries_total", '{outcome="failed",workflow="mnt-retry-once"}') >= 0


def test_the_readme_lists_every_metric_and_its_labels() -> None:
    from pathlib import Path

    from app.metrics import database_families

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Metrics\n", 1)[1].split("\n### ", 1)[0]
    snap = {"by_status": {}, "by_status_workflow": {("admitted", "w"): 1}, "parked": {},
            "waiting": {("due", "w"): 1}, "oldest_by_reason": {},
            "outcome_unknown": 0, "unacknowledged_executions": 0, "unacknowledged_sum": 0,
            "integrity_conflicts": 0, "live_workers": 0, "live_capacity": 0}
    families = [*METRICS.registry.collect(), *database_families(snap)]
    for family in families:
        if not family.name.startswith("fencepost_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in section, f"README's Metrics section lacks {name}"
        labels = {k for sample in family.samples for k in sample.labels if k not in ("le",)}
        for label in labels:
            assert f"`{label}`" in section, f"README's Metrics section lacks label {label}"
