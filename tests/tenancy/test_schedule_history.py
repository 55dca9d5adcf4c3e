"""Schedule history in its own table (issue 11, item 2).

A schedule's events (created, fired, slots skipped, paused, resumed) live in
`schedule_events`, not in `execution_events` under the pseudo execution ID
`schedule:{id}`, which a client could admit as a real execution and so read,
mix with or delete. `GET /v1/executions/{id}/events` for an ID with no
execution is 404.
"""

from __future__ import annotations

from app.registry import load_workflows
from app.scheduler import Scheduler
from tests.support.responses import assert_error

WORKFLOWS = load_workflows(["tests.schedules.flows"])
SCHEDULE = {"scheduleId": "nightly", "workflowId": "sched-test-plain", "cron": "0 * * * *",
            "timezone": "UTC"}


async def pseudo_rows(pool) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id LIKE 'schedule:%' "
        "AND NOT EXISTS (SELECT 1 FROM executions e "
        "                WHERE e.execution_id = execution_events.execution_id)")


async def test_schedule_events_are_written_to_schedule_events_and_read_from_there(
        api, tokens, store, pool):
    ops = tokens.operate.headers
    r = await api.post("/v1/schedules", json=SCHEDULE, headers=ops)
    assert r.status_code == 201, r.text
    assert (await api.post("/v1/schedules/nightly/pause", headers=ops)).status_code == 200
    assert (await api.post("/v1/schedules/nightly/resume", headers=ops)).status_code == 200
    # Ten hours of downtime: one slot fires (catch-up 1), nine are skipped.
    await pool.execute("UPDATE schedules SET last_slot = now() - interval '10 hours' "
                       "WHERE schedule_id = 'nightly'")
    result = await Scheduler(store, WORKFLOWS, catch_up_default=1).run_once()
    assert len(result.admitted) == 1 and result.skipped == 9, result

    kinds = ["schedule_created", "schedule_paused", "schedule_resumed", "schedule_fired",
             "schedule_slots_skipped"]
    stored = await pool.fetch("SELECT schedule_id, kind, detail FROM schedule_events "
                              "ORDER BY event_id")
    assert [(r["schedule_id"], r["kind"]) for r in stored] == [("nightly", k) for k in kinds]
    assert await pseudo_rows(pool) == 0

    r = await api.get("/v1/schedules/nightly/events", headers=tokens.read.headers)
    assert r.status_code == 200, r.text
    events = r.json()["events"]
    assert [e["kind"] for e in events] == kinds
    assert events[0]["detail"]["by"] == "ops"
    assert events[3]["detail"]["executionId"] == result.admitted[0]
    # The slot's execution has its own history, and no schedule events.
    r = await api.get(f"/v1/executions/{result.admitted[0]}/events", headers=ops)
    assert [e["kind"] for e in r.json()["events"]] == ["admitted"]


async def test_events_of_an_id_with_no_execution_are_404(api, tokens, store, pool):
    r = await api.post("/v1/schedules", json=SCHEDULE, headers=tokens.operate.headers)
    assert r.status_code == 201, r.text
    for token in (tokens.operate, tokens.read, tokens.a):
        for eid in ("schedule:nightly", "schedule:x", "no-such-execution"):
            assert_error(await api.get(f"/v1/executions/{eid}/events", headers=token.headers),
                         404, "EXECUTION_NOT_FOUND")
    # Even a row left under a pseudo ID (an old database) is not an execution's history.
    await pool.execute("INSERT INTO execution_events (execution_id, bucket, kind, seq) "
                       "VALUES ('schedule:old', fencepost_bucket('schedule:old'), "
                       "'schedule_created', 1)")
    assert_error(await api.get("/v1/executions/schedule:old/events",
                               headers=tokens.operate.headers), 404, "EXECUTION_NOT_FOUND")


async def test_a_client_execution_named_schedule_colon_id_sees_only_its_own_events(
        api, tokens, store, pool, admit_as):
    ops = tokens.operate.headers
    await admit_as(api, tokens.a, "schedule:nightly")
    r = await api.post("/v1/schedules", json=SCHEDULE, headers=ops)
    assert r.status_code == 201, r.text
    assert (await api.post("/v1/schedules/nightly/pause", headers=ops)).status_code == 200
    await store.operator.request_wake("schedule:nightly")

    for token in (tokens.a, tokens.operate):
        r = await api.get("/v1/executions/schedule:nightly/events", headers=token.headers)
        assert r.status_code == 200, r.text
        assert [e["kind"] for e in r.json()["events"]] == ["admitted", "wake_requested"]
    r = await api.get("/v1/schedules/nightly/events", headers=ops)
    assert [e["kind"] for e in r.json()["events"]] == ["schedule_created", "schedule_paused"]

    # Deleting the schedule (and pruning its events) leaves the execution's history alone.
    await store.schedules.prune_schedule_events(["sched-test-plain"], 0)
    assert (await api.delete("/v1/schedules/nightly", headers=ops)).status_code == 204
    assert await pool.fetchval("SELECT count(*) FROM schedule_events") == 0
    r = await api.get("/v1/executions/schedule:nightly/events", headers=tokens.a.headers)
    assert [e["kind"] for e in r.json()["events"]] == ["admitted", "wake_requested"]


async def test_code_schedules_dropped_take_their_events_from_schedule_events_only(
        store, pool, admit_as, api, tokens):
    await admit_as(api, tokens.a, "schedule:sched-test-plain")
    created, _ = await store.schedules.create_schedule(
        schedule_id="sched-test-plain", workflow_id="sched-test-plain", cron="0 * * * *",
        timezone="UTC", params={})
    assert created
    await pool.execute("UPDATE schedules SET source = 'code' "
                       "WHERE schedule_id = 'sched-test-plain'")
    assert await store.schedules.drop_code_schedules(["sched-test-plain"]) == ["sched-test-plain"]
    assert await pool.fetchval("SELECT count(*) FROM schedule_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM execution_events "
                               "WHERE execution_id = 'schedule:sched-test-plain'") == 1
