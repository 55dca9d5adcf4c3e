"""Issue 11 item 3: IDs fencepost derives cannot be taken by clients.

Children default to `{parent}~{key}` and schedule slots to
`{scheduleId}~{slot in UTC}`; `~` is outside the client ID alphabet and
admission refuses it (422 RESERVED_EXECUTION_ID). The attacks: tenant B
admits the ID a child or a slot would get before the parent or the scheduler
does; the parent must still complete and the scheduled run must still
happen. Executions recorded under the older `:` forms keep their IDs (a
replay returns the recorded child ID).
"""

from __future__ import annotations

from datetime import UTC, timedelta

from app import cron
from app.registry import load_workflows
from app.scheduler import Scheduler
from tests.support.admission import admission_body
from tests.support.waiting import wait_status
from tests.tenancy.conftest import headers

WORKFLOWS = load_workflows(["tests.tenancy.flows_g"])




def admit_body(execution_id: str, workflow_id: str = "g-plain") -> dict:
    return admission_body(workflow_id, execution_id)


async def test_a_client_cannot_admit_an_id_with_the_system_separator(api, tokens, pool):
    for role in (tokens.a, tokens.b):
        r = await api.post("/v1/executions", json=admit_body("sq-1~kid0"), headers=headers(role))
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "RESERVED_EXECUTION_ID"
        assert "made by fencepost for child executions and schedule slots" in error["message"]
    assert await pool.fetchval("SELECT count(*) FROM executions") == 0


async def test_a_parent_completes_though_a_tenant_took_its_child_id_first(
        api, tokens, admit_as, store, workers):
    # Tenant B squats the child ID `sq-1` got before the `~` form (an
    # ordinary client ID: admitted, and no longer in the parent's way).
    await admit_as(api, tokens.b, "sq-1:kid0", workflow_id="g-kid")

    await admit_as(api, tokens.a, "sq-1", workflow_id="g-parent")
    await workers.start()
    record = await wait_status(store, "sq-1", "completed", "failed", timeout=30)
    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"] == {"result": {"child": "sq-1~kid0", "result": "kid-done"}}
    child = await store.history.get("sq-1~kid0")
    assert child["parent_execution_id"] == "sq-1" and child["status"] == "completed"
    # Tenant B's execution is untouched: still its own, not the child.
    squatter = await store.history.get("sq-1:kid0")
    assert squatter["admitted_by"] == tokens.b.token_id
    assert squatter["parent_execution_id"] is None
    # And the child's own form cannot be squatted: refused before any lookup.
    r = await api.post("/v1/executions", json=admit_body("sq-2~kid0", "g-kid"),
                       headers=headers(tokens.b))
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "RESERVED_EXECUTION_ID"


async def test_a_parent_recorded_under_the_old_child_form_replays_its_recorded_child(
        store, pool, workers):
    """A parent whose start_child step recorded `old-1:kid0` (before the `~`
    form) keeps that child on replay: the step's value is the child ID."""
    await store.admissions.admit(workflow_id="g-parent", params={}, execution_id="old-1")
    [d] = await store.leases.claim_due(1, 30.0, "old-worker")
    answer, _ = await store.compose.start_child(d.lease, "kid0", workflow_id="g-kid", params={},
                                        child_id="old-1:kid0")
    assert answer == "started"
    await store.steps.write_step(d.lease, "kid0", value="old-1:kid0", error=None,
                           function_name="child:g-kid", attempts=1)
    await store.leases.release(d.lease)

    await workers.start()
    record = await wait_status(store, "old-1", "completed", "failed", timeout=30)
    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"] == {"result": {"child": "old-1:kid0", "result": "kid-done"}}
    assert await store.history.get("old-1~kid0") is None
    assert await pool.fetchval(
        "SELECT count(*) FROM executions WHERE parent_execution_id = 'old-1'") == 1


async def test_a_scheduled_run_happens_though_a_tenant_took_its_slot_id_first(
        api, tokens, admit_as, store, pool):
    created, _ = await store.schedules.create_schedule(
        schedule_id="nightly", workflow_id="g-plain", cron="0 * * * *", timezone="UTC",
        params={}, catch_up=2)
    assert created
    # One slot due: the top of this hour.
    await pool.execute("UPDATE schedules SET last_slot = date_trunc('hour', now()) "
                       "- interval '1 minute' WHERE schedule_id = 'nightly'")
    after = await pool.fetchval("SELECT last_slot FROM schedules WHERE schedule_id = 'nightly'")
    due, _ = cron.slots(cron.parse("0 * * * *"), cron.zone("UTC"), after,
                        after + timedelta(minutes=1, seconds=1), 10)
    [slot] = due
    minute = slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")
    slot_id = cron.slot_id("nightly", slot)

    # Tenant B squats the slot's pre-`~` ID (a squat used to suppress the
    # scheduled run): an ordinary client ID now. (A deadline in the past,
    # which made the squat end at once, is refused at admission since issue 19.)
    deadline = "2099-01-01T00:00:00Z"
    await admit_as(api, tokens.b, f"nightly:{minute}", workflow_id="g-plain", deadline=deadline)

    result = await Scheduler(store, WORKFLOWS).run_once()
    # (A second slot is admitted too if the hour turned meanwhile.)
    assert result.admitted[0] == slot_id and not result.conflicts, result
    assert slot_id == f"nightly~{minute}"
    fired = await store.history.get(slot_id)
    assert fired["admitted_by"] is None and fired["status"] == "admitted"
    assert fired["context"]["scheduleId"] == "nightly"

    # The slot's own form is refused from clients (the next hour's slot here).
    later = cron.slot_id("nightly", slot + timedelta(hours=1))
    r = await api.post("/v1/executions", json={**admit_body(later), "deadline": deadline},
                       headers=headers(tokens.b))
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "RESERVED_EXECUTION_ID"
