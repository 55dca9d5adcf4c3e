"""Metrics per queue (issue 15, Visible), read from the database when
/metrics is scraped, by the claim's counting and blockedBy's rule:
fencepost_queue_running, _due, _limited, _limit{kind}; and the starts each
process's claims made, per queue (fencepost_queue_starts_total)."""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest

from app.metrics import METRICS
from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.claims import claim

pytestmark = pytest.mark.timeout(60)

WF = "op-quick"


def sample(text: str, name: str, labels: str = "") -> float | None:
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else None


async def scrape(api: httpx.AsyncClient) -> str:
    r = await api.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


def per_queue(text: str, queue: str) -> dict[str, float | None]:
    label = f'{{queue="{queue}"}}'
    return {name: sample(text, f"fencepost_queue_{name}", label)
            for name in ("running", "due", "limited")}


def starts(queue: str) -> float:
    return sample(METRICS.render().decode(), "fencepost_queue_starts_total",
                  f'{{queue="{queue}"}}') or 0.0


async def test_running_due_and_held_back_per_queue_with_its_limits(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await store.workers.register_worker("w-live", host="t", pid=1, workflows=[WF],
                                        concurrency=8)
    await store.queues.change("payments", {"concurrency": 1, "rate_limit": 10,
                                           "rate_period": 60.0}, actor="test")
    await store.queues.change("reports", {"paused": True}, actor="test")
    for i in range(3):
        await admit(store, WF, f"pay{i}", queue="payments")
    await admit(store, WF, "rep0", queue="reports")
    await admit(store, WF, "plain")
    before = starts("payments")
    claimed = await claim(store)
    assert sorted(claimed) == ["pay0", "plain"]
    assert starts("payments") == before + 1

    text = await scrape(api)
    assert per_queue(text, "payments") == {"running": 1, "due": 2, "limited": 2}, text
    assert per_queue(text, "reports") == {"running": 0, "due": 1, "limited": 1}
    assert per_queue(text, "default") == {"running": 1, "due": 0, "limited": 0}
    limits = {kind: sample(text, "fencepost_queue_limit", f'{{kind="{kind}",queue="payments"}}')
              for kind in ("concurrency", "per_key_concurrency", "rate_limit",
                           "rate_period_seconds")}
    assert limits == {"concurrency": 1, "per_key_concurrency": None, "rate_limit": 10,
                      "rate_period_seconds": 60}, limits
    assert 'fencepost_queue_limit{kind="concurrency",queue="default"}' not in text
    # The held-back ones count among the waiting executions by their reason.
    assert sample(text, "fencepost_waiting_executions",
                  f'{{reason="concurrency-limit",workflow="{WF}"}}') == 2
    assert sample(text, "fencepost_waiting_executions",
                  f'{{reason="queue-paused",workflow="{WF}"}}') == 1

    # Each freed slot takes the next in line; pay0's resumption is not a start.
    await store.leases.acknowledge(claimed["pay0"].lease, "suspended",
                                   waiting_on={"signal": "go"})
    pay1 = await claim(store)
    assert list(pay1) == ["pay1"]
    await store.operator.request_wake("pay0")
    await store.leases.acknowledge(pay1["pay1"].lease, "completed", result=1)
    pay2 = await claim(store)
    assert list(pay2) == ["pay2"]  # due before pay0 was woken
    await store.leases.acknowledge(pay2["pay2"].lease, "completed", result=1)
    assert list(await claim(store)) == ["pay0"]
    assert starts("payments") == before + 3
    text = await scrape(api)
    assert per_queue(text, "payments") == {"running": 1, "due": 0, "limited": 0}, text
