"""Metrics are present and move on a small run: the worker's counters and
histograms, and the database gauges the API's /metrics reads."""

import asyncio
import re

from app.metrics import METRICS
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.worker import Worker
from tests.support.asgi import asgi_client
from tests.support.waiting import wait_until


def sample(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name}{labels} missing from:\n{text}"
    return float(found.group(1))


async def test_metrics_are_present_and_move(database_url, pool):
    settings = Settings(database_url=database_url, lease_seconds=2, renew_seconds=0.2,
                        poll_seconds=0.1, redelivery_base_seconds=0.05,
                        redelivery_cap_seconds=0.1, auth="disabled")
    store = ExecutionStore.from_settings(pool, settings)
    workflows = load_workflows(["tests.maintenance.flows"])
    METRICS.init_workflows(workflows)  # as the API and each worker do at start
    before = METRICS.render().decode()
    claims0 = sum(sample(before, "fencepost_claims_total", f'{{workflow="{w}"}}')
                  for w in ("mnt-ok", "mnt-retry-once"))
    released0 = sample(before, "fencepost_unacknowledged_deliveries_total")
    steps0 = sample(before, "fencepost_step_duration_seconds_count", '{workflow="mnt-ok"}')
    completed0 = sample(before, "fencepost_deliveries_total",
                        '{outcome="completed",workflow="mnt-ok"}')

    async with asgi_client(settings, workflows) as c:
        for i in range(3):
            await store.admissions.admit(workflow_id="mnt-ok", params={}, execution_id=f"ok-{i}")
        await store.admissions.admit(workflow_id="mnt-retry-once", params={}, execution_id="retry")
        await store.admissions.admit(workflow_id="mnt-ok", params={}, execution_id="stuck")
        await pool.execute(  # parked as poison, for the gauge
            "UPDATE executions SET status = 'parked', parked_reason = 'poison', "
            "unacknowledged_deliveries = 25, due_at = NULL WHERE execution_id = 'stuck'")

        gauges = (await c.get("/metrics")).text
        assert sum(sample(gauges, "fencepost_executions", f'{{status="admitted",workflow="{w}"}}')
               for w in workflows) == 4
        assert sample(gauges, "fencepost_parked_executions", '{reason="poison"}') == 1
        assert sample(gauges, "fencepost_unacknowledged_deliveries_current") == 25
        assert sample(gauges, "fencepost_oldest_due_age_seconds") >= 0

        worker = Worker(settings, workflows, concurrency=4)
        task = asyncio.create_task(worker.run())
        try:
            async def all_done():
                rows = await pool.fetch("SELECT status FROM executions "
                                        "WHERE execution_id <> 'stuck'")
                return all(r["status"] == "completed" for r in rows)
            await wait_until(all_done, timeout=15.0, what="every execution done")
        finally:
            worker.request_stop()
            await task

        gauges = (await c.get("/metrics")).text
        assert sum(sample(gauges, "fencepost_executions", f'{{status="admitted",workflow="{w}"}}')
               for w in workflows) == 0
        assert sample(gauges, "fencepost_executions_with_unacknowledged_deliveries") == 1

    after = METRICS.render().decode()
    assert sum(sample(after, "fencepost_claims_total", f'{{workflow="{w}"}}')
               for w in ("mnt-ok", "mnt-retry-once")) >= claims0 + 5  # 4 + the redelivery
    assert sample(after, "fencepost_unacknowledged_deliveries_total") == released0 + 1
    assert sample(after, "fencepost_step_duration_seconds_count",
                  '{workflow="mnt-ok"}') >= steps0 + 3
    assert sample(after, "fencepost_deliveries_total",
                  '{outcome="completed",workflow="mnt-ok"}') >= completed0 + 3
    assert sample(after, "fencepost_delivery_duration_seconds_count",
                  '{workflow="mnt-ok"}') >= 3
