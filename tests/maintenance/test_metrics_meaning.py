"""Issue 10 item 13, metrics mean what they say: the outcome-unknown gauge
counts only executions still waiting for a decision; the lease-expiry counter
says it counts claim takeovers too; late observations and integrity conflicts
have counters; the API's gauge of executions with integrity conflicts, and
`integrityConflicts` on the record and the dashboard page."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.metrics import METRICS
from app.settings import Settings
from app.store import Admitted, ExecutionStore
from tests.support.asgi import asgi_client

pytestmark = pytest.mark.timeout(60)


def sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name}{labels} missing from:\n{text}"
    return float(found.group(1))


def help_text(text: str, name: str) -> str:
    found = re.search(rf"^# HELP {re.escape(name)} (.*)$", text, re.M)
    assert found, f"no HELP for {name}"
    return found.group(1)


@pytest.fixture
def m_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, auth="disabled", workflows="")


@pytest.fixture
def store_settings(m_settings: Settings) -> Settings:
    return m_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def api(m_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(m_settings, {}) as client:
        yield client


async def gauges(api: httpx.AsyncClient) -> str:
    r = await api.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


async def park_outcome_unknown(store: ExecutionStore, eid: str, **admit) -> None:
    assert isinstance(await store.admissions.admit(workflow_id="m-charge", params={}, execution_id=eid,
                                        **admit), Admitted)
    [d] = await store.leases.claim_due(1, 30, "w", ["m-charge"])
    await store.effects.begin_effect(d.lease, "charge", idempotency_key=f"{eid}:charge",
                             function_name="remote_charge")
    assert await store.effects.park_outcome_unknown(d.lease, "charge") == "parked"


async def test_outcome_unknown_gauge_counts_only_executions_waiting_for_a_decision(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    name = "fencepost_outcome_unknown_steps"
    for eid in ("resolved", "cancelled", "timed-out", "waiting"):
        await park_outcome_unknown(store, eid, timeout_seconds=3600)
    assert sample(await gauges(api), name) == 4

    # Resolved: the step's fate is decided; the execution runs again.
    assert (await store.operator.resolve_step("resolved", "charge", "retry", by="ops"))[0] == "resolved"
    assert sample(await gauges(api), name) == 3
    # Cancelled while parked: terminal, its effect row stays as evidence.
    assert (await store.operator.request_cancel("cancelled", "ops"))[0] == "cancelled"
    assert sample(await gauges(api), name) == 2
    # Past its deadline: timed out (as the read reports it, before the sweep too).
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 second' "
                       "WHERE execution_id = 'timed-out'")
    assert sample(await gauges(api), name) == 1
    await store.leases.sweep_interrupted()
    text = await gauges(api)
    assert sample(text, name) == 1
    assert sample(text, "fencepost_parked_executions", '{reason="outcome_unknown"}') == 1
    left = await pool.fetchval("SELECT count(*) FROM effects WHERE status = 'outcome_unknown'")
    assert left == 3  # the rows the old gauge counted
    assert "awaiting an operator's decision" in help_text(text, name)


def test_lease_takeover_counter_says_it_counts_claim_takeovers_too() -> None:
    text = METRICS.render().decode()
    words = help_text(text, "fencepost_lease_takeovers_total")
    assert "reaper" in words and "claim" in words, words


def test_late_observation_and_integrity_conflict_counters_exist() -> None:
    text = METRICS.render().decode()
    assert sample(text, "fencepost_late_observations_total") >= 0
    assert sample(text, "fencepost_integrity_conflicts_total") >= 0
    assert "late observation" in help_text(text, "fencepost_late_observations_total")
    assert "differ" in help_text(text, "fencepost_integrity_conflicts_total")
    METRICS.late_observations.inc()
    METRICS.integrity_conflicts.inc()


async def test_integrity_conflicts_on_the_record_the_dashboard_and_the_gauge(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    name = "fencepost_executions_with_integrity_conflicts"
    await store.admissions.admit(workflow_id="m-other", params={}, execution_id="clean")
    await store.admissions.admit(workflow_id="m-step", params={}, execution_id="doubted")
    assert sample(await gauges(api), name) == 0
    assert (await api.get("/v1/executions/doubted")).json()["integrityConflicts"] == 0

    # A stale holder's late result that differs from the recorded step.
    [stale] = await store.leases.claim_due(1, 30, "stale", ["m-step"])
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                       "WHERE execution_id = $1", stale.lease.execution_id)
    [current] = await store.leases.claim_due(1, 30, "current", ["m-step"])
    eid = current.lease.execution_id
    assert eid == stale.lease.execution_id == "doubted"
    await store.steps.write_step(current.lease, "s", value="current's", function_name="f")
    assert await store.steps.record_late_observation(stale.lease, "s", value="stale's") is True
    assert await store.steps.record_late_observation(stale.lease, "s", value="current's") is False

    text = await gauges(api)
    assert sample(text, name) == 1
    rec = (await api.get(f"/v1/executions/{eid}")).json()
    assert rec["integrityConflicts"] == 1, rec
    listed = (await api.get("/v1/executions")).json()["executions"]
    assert {e["executionId"]: e["integrityConflicts"] for e in listed} == {
        "clean": 0, "doubted": 1}
    page = await api.get(f"/ui/executions/{eid}")
    assert page.status_code == 200, page.text
    assert 'id="integrity-conflicts"' in page.text and "1 integrity conflict " in page.text
    assert page.text.count("differs: integrity conflict") == 1  # the late observations' column
    assert page.text.count('<span class="ok">same</span>') == 1
