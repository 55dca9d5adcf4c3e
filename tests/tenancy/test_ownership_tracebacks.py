"""Tracebacks of failed executions (issue 11, item 9): `read` and `operate`
see them; a trigger token, even on its own execution, sees an error's name and
message only (record outcome, events, steps, late observations)."""

from __future__ import annotations

from app.store import Admitted

TRACEBACK = ('Traceback (most recent call last):\n  File "/srv/app/secret_module.py", '
             'line 42, in charge\n    db_password = "hunter2"\nValueError: card declined\n')
ERROR = {"name": "ValueError", "message": "card declined", "traceback": "step-level detail"}


async def failed_execution(store, tokens) -> str:
    eid = "tb-1"
    answer = await store.admissions.admit(workflow_id="wf", params={}, execution_id=eid,
                               admitted_by=tokens.a.token_id)
    assert isinstance(answer, Admitted)
    [first] = await store.leases.claim_due(1, 30, "worker-1")
    # A second holder takes over; the first one's late failure is kept as evidence.
    await store.pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                             "WHERE execution_id = $1", eid)
    [d] = await store.leases.claim_due(1, 30, "worker-2")
    await store.steps.write_step(d.lease, "charge", error=ERROR, function_name="charge")
    await store.steps.record_late_observation(first.lease, "charge", error=ERROR)
    await store.leases.acknowledge(d.lease, "failed", error=ERROR, traceback=TRACEBACK)
    return eid


async def views(api, token, eid: str) -> dict:
    out = {}
    for route, path in (("record", ""), ("events", "/events"),
                        ("steps", "/steps?includeValues=true"),
                        ("late", "/late-observations")):
        r = await api.get(f"/v1/executions/{eid}{path}", headers=token.headers)
        assert r.status_code == 200, (token.name, route, r.text)
        out[route] = r.json()
    return out


async def test_a_trigger_token_sees_the_error_name_and_message_only(api, tokens, store):
    eid = await failed_execution(store, tokens)
    seen = await views(api, tokens.a, eid)
    text = str(seen)
    assert "hunter2" not in text and "secret_module" not in text and "traceback" not in text, text
    short = {"name": "ValueError", "message": "card declined"}
    assert seen["record"]["status"] == "failed"
    assert seen["record"]["outcome"] == {"error": short}
    [acked] = [e for e in seen["events"]["events"] if e["kind"] == "acknowledged"]
    assert acked["detail"] == {"status": "failed", "reported": "failed"}, acked
    assert [s["error"] for s in seen["steps"]["steps"]] == [short]
    assert [o["error"] for o in seen["late"]["lateObservations"]] == [short]


async def test_read_and_operate_tokens_see_the_traceback(api, tokens, store):
    eid = await failed_execution(store, tokens)
    for token in (tokens.read, tokens.operate):
        seen = await views(api, token, eid)
        [acked] = [e for e in seen["events"]["events"] if e["kind"] == "acknowledged"]
        assert acked["detail"]["traceback"] == TRACEBACK, token.name
        assert seen["record"]["outcome"] == {"error": ERROR}, token.name
        assert [s["error"] for s in seen["steps"]["steps"]] == [ERROR], token.name
        assert [o["error"] for o in seen["late"]["lateObservations"]] == [ERROR], token.name
