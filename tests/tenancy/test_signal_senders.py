"""Issue 11 item 4 (and item 8's bound on pending signals): signals record
their sender, workflows may restrict who sends a signal, and the owner
predicate sits in the statement that stores the signal.

Attacks: tenant B signals tenant A's execution with the body held back while
A admits it (real uvicorn, raw socket) -> 404, nothing stored; the service
that requested a refund approves it itself -> 403, nothing stored; an
operator approves -> 202 and the workflow records the operator as approver.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from app.registry import WorkflowRegistrationError, load_workflows, workflow
from tests.support.processes import is_registered, spawn_worker
from tests.support.races import RowLock, until_waiting
from tests.support.waiting import wait_status, wait_until
from tests.support.workers import InProcessWorkers
from tests.tenancy.conftest import error_code, headers, raw_connect, read_response, send_head

WORKFLOWS = load_workflows(["tests.tenancy.flows_g"])
EXAMPLES = load_workflows(["app.examples"])


async def signal_rows(pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT name, payload, sender_token_id, sender_name, sender_role, consumed_step "
        "FROM signals WHERE execution_id = $1 ORDER BY signal_id", execution_id)
    return [dict(r) for r in rows]


async def received_events(pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT detail FROM execution_events WHERE execution_id = $1 "
        "AND kind = 'signal_received' ORDER BY event_id", execution_id)
    return [r["detail"] for r in rows]




# ------------------------------------------------------------------ senders


async def test_a_signal_records_its_sender_in_the_row_and_its_event(
        api, tokens, admit_as, pool):
    await admit_as(api, tokens.a, "sig-1")
    r = await api.post("/v1/executions/sig-1/signals/go", json={"n": 1},
                       headers=headers(tokens.a))
    assert r.status_code == 202, r.text
    r = await api.post("/v1/executions/sig-1/signals/go", json={"n": 2},
                       headers=headers(tokens.operate))
    assert r.status_code == 202, r.text

    assert [(s["payload"], s["sender_token_id"], s["sender_name"], s["sender_role"])
            for s in await signal_rows(pool, "sig-1")] == [
        ({"n": 1}, tokens.a.token_id, "tenant-a", "trigger"),
        ({"n": 2}, tokens.operate.token_id, "ops", "operate"),
    ]
    assert [e["sender"] for e in await received_events(pool, "sig-1")] == [
        {"tokenId": tokens.a.token_id, "name": "tenant-a", "role": "trigger"},
        {"tokenId": tokens.operate.token_id, "name": "ops", "role": "operate"},
    ]
    # The event is readable through the API by the owner.
    r = await api.get("/v1/executions/sig-1/events", headers=headers(tokens.a))
    assert r.status_code == 200, r.text
    senders = [e["detail"]["sender"]["name"] for e in r.json()["events"]
               if e["kind"] == "signal_received"]
    assert senders == ["tenant-a", "ops"]


async def test_workflow_code_reads_the_sender_and_a_replay_returns_the_recorded_one(
        api, tokens, admit_as, store, pool, workers):
    await admit_as(api, tokens.a, "who-1", workflow_id="g-who")
    r = await api.post("/v1/executions/who-1/signals/go", json={"x": 1},
                       headers=headers(tokens.a))
    assert r.status_code == 202, r.text
    await workers.start()
    # Consumed by the first delivery, which then suspends on `next`.
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) FROM execution_steps WHERE execution_id = 'who-1'"), what="consume")
    await wait_status(store, "who-1", "suspended", timeout=30)
    step = await pool.fetchrow(
        "SELECT value, function_name FROM execution_steps "
        "WHERE execution_id = 'who-1' AND step_key = 'signal:go'")
    assert step["function_name"] == "signal-with-sender:go"
    assert step["value"] == {
        "payload": {"x": 1},
        "sender": {"tokenId": tokens.a.token_id, "name": "tenant-a", "role": "trigger"},
    }
    # The next delivery replays `go` from the record (its sender included).
    r = await api.post("/v1/executions/who-1/signals/next", json="then",
                       headers=headers(tokens.operate))
    assert r.status_code == 202, r.text
    record = await wait_status(store, "who-1", "completed", "failed", timeout=30)
    assert record["outcome"] == {"result": {
        "payload": {"x": 1}, "sender": [tokens.a.token_id, "tenant-a", "trigger"],
        "next": "then"}}
    claims = await pool.fetchval("SELECT count(*) FROM execution_events "
                                 "WHERE execution_id = 'who-1' AND kind = 'claimed'")
    assert claims >= 2


# ---------------------------------------------------------- who may send


def test_signals_restrictions_are_checked_at_registration():
    for bad in ({"approval": "admin"}, {"approval": []}, {"not ok": "operate"}, ["approval"]):
        with pytest.raises(WorkflowRegistrationError):
            workflow("g-bad-signals", signals=bad)
    d = EXAMPLES["approve-refund"]
    assert d.may_signal("approval", {"operate", "read"})
    assert not d.may_signal("approval", {"trigger"})
    assert d.may_signal("other", {"trigger"})


async def test_the_requesting_service_cannot_approve_its_own_refund(
        make_api, tokens, admit_as, store, pool, database_url, tmp_path):
    api = await make_api(workflows=EXAMPLES)
    params = {"order_id": 7, "amount_cents": 1250}
    await admit_as(api, tokens.a, "refund-7", workflow_id="approve-refund", params=params)

    # The service that asked for the refund approves it: refused, nothing stored.
    r = await api.post("/v1/executions/refund-7/signals/approval",
                       json={"approved": True, "by": "operator-jane"}, headers=headers(tokens.a))
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "FORBIDDEN"
    assert "only from a token with role operate" in error["message"]
    assert await signal_rows(pool, "refund-7") == []
    assert await received_events(pool, "refund-7") == []

    # An operator approves it, and a real worker process runs the example.
    r = await api.post("/v1/executions/refund-7/signals/approval", json={"approved": True},
                       headers=headers(tokens.operate))
    assert r.status_code == 202, r.text
    worker = spawn_worker("refunds", database_url=database_url, flows_module="app.examples",
                          log_dir=tmp_path, worker_id="g-refunds", concurrency=2,
                          settings={"FENCEPOST_POLL_SECONDS": "0.2"})
    try:
        await wait_until(lambda: is_registered(pool, worker), timeout=30, what="worker up")
        record = await wait_status(store, "refund-7", "completed", "failed", timeout=30)
    finally:
        worker.kill()
    assert record["status"] == "completed", (record["outcome"], worker.log())
    result = record["outcome"]["result"]
    assert result["refunded"] is True
    assert result["approvedBy"] == {"tokenId": tokens.operate.token_id, "name": "ops",
                                    "role": "operate"}


# ---------------------------------------------------- owner in the statement


async def test_a_trigger_token_cannot_signal_a_foreign_or_missing_execution(
        api, tokens, admit_as, pool):
    await admit_as(api, tokens.a, "mine-a")
    for eid in ("mine-a", "nobody"):
        r = await api.post(f"/v1/executions/{eid}/signals/ping", json={"evil": True},
                           headers=headers(tokens.b))
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "EXECUTION_NOT_FOUND"
    assert await pool.fetchval("SELECT count(*) FROM signals") == 0


async def test_a_held_back_body_cannot_signal_an_execution_admitted_meanwhile(
        server, tokens, pool):
    """Tenant B sends the head of a signal to `victim-1` (which does not exist
    yet) and holds the body; tenant A admits `victim-1`; B sends the body.
    404, and nothing is stored. The server is a real uvicorn; B is a raw
    socket; A's admission happens only after B's request was authenticated
    (so any work done before reading the body would be done on a missing ID)."""
    authenticated = threading.Event()
    verifier = server.app.state.verifier
    verify = verifier.verify

    async def observed(token: str):
        principal = await verify(token)
        if token == tokens.b.token:
            authenticated.set()
        return principal

    verifier.verify = observed
    body = json.dumps({"steal": "payload"}).encode()
    reader, writer = await raw_connect(server.port)
    try:
        await send_head(writer, "POST", "/v1/executions/victim-1/signals/ping", tokens.b,
                        len(body))
        await wait_until(authenticated.is_set, what="B's request authenticated")
        async with server.client() as client:
            r = await client.post("/v1/executions", headers=headers(tokens.a),
                                  json={"workflowId": "wf", "params": {},
                                        "executionId": "victim-1"})
            assert r.status_code == 201, r.text
        writer.write(body)
        await writer.drain()
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert status == 404, answer
    assert error_code(answer) == "EXECUTION_NOT_FOUND"
    assert await signal_rows(pool, "victim-1") == []
    assert await received_events(pool, "victim-1") == []


# ------------------------------------------------------------ pending bound


async def test_signals_past_the_pending_bound_are_refused_and_nothing_is_stored(
        make_api, tenancy_settings, tokens, admit_as, store, pool):
    api = await make_api(settings=tenancy_settings.model_copy(update={"max_pending_signals": 3}))
    await admit_as(api, tokens.a, "full-1")
    for n in range(3):
        r = await api.post("/v1/executions/full-1/signals/s", json=n, headers=headers(tokens.a))
        assert r.status_code == 202, r.text
    r = await api.post("/v1/executions/full-1/signals/s", json=3, headers=headers(tokens.a))
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "TOO_MANY_PENDING_SIGNALS"
    assert int(r.headers["retry-after"]) > 0
    assert len(await signal_rows(pool, "full-1")) == 3
    assert len(await received_events(pool, "full-1")) == 3

    # One consumed: room for one more.
    [d] = await store.leases.claim_due(1, 30.0, "g-worker")
    assert await store.signals.consume_signal(d.lease, "k", "s") is not None
    r = await api.post("/v1/executions/full-1/signals/s", json=4, headers=headers(tokens.a))
    assert r.status_code == 202, r.text
    r = await api.post("/v1/executions/full-1/signals/s", json=5, headers=headers(tokens.a))
    assert r.status_code == 429, r.text


async def test_the_pending_bound_is_exact_under_concurrent_senders(
        make_api, tenancy_settings, tokens, admit_as, pool):
    """16 senders at once against a bound of 5: exactly 5 stored (each sender
    counts under the row lock, in a snapshot taken after it got the lock)."""
    api = await make_api(settings=tenancy_settings.model_copy(update={"max_pending_signals": 5}))
    await admit_as(api, tokens.a, "race-1")

    async def send(n: int) -> int:
        r = await api.post("/v1/executions/race-1/signals/s", json=n, headers=headers(tokens.a))
        return r.status_code

    statuses = await asyncio.gather(*(send(n) for n in range(16)))
    assert sorted(statuses) == [202] * 5 + [429] * 11, statuses
    assert len(await signal_rows(pool, "race-1")) == 5


async def test_two_senders_queued_on_the_row_with_room_for_one_store_one(
        make_api, tenancy_settings, tokens, admit_as, pool):
    """The interleaving a count in the wrong snapshot would let through: two
    senders queue behind a held row lock with room for one more signal; the
    second to get the row must see the first's signal. Forced with a RowLock
    (both senders waiting on the row before it is released)."""
    api = await make_api(settings=tenancy_settings.model_copy(update={"max_pending_signals": 2}))
    await admit_as(api, tokens.a, "queue-1")
    r = await api.post("/v1/executions/queue-1/signals/s", json=0, headers=headers(tokens.a))
    assert r.status_code == 202, r.text

    async def send(n: int) -> int:
        r = await api.post("/v1/executions/queue-1/signals/s", json=n, headers=headers(tokens.a))
        return r.status_code

    async with RowLock(pool, "queue-1") as lock:
        first = asyncio.create_task(send(1))
        await until_waiting(pool, 1, "row", what="first sender", also=first.done)
        second = asyncio.create_task(send(2))
        await until_waiting(pool, 2, "row", what="second sender behind it", also=second.done)
        assert not first.done() and not second.done()
        await lock.release()
    assert (await first, await second) == (202, 429)
    assert [s["payload"] for s in await signal_rows(pool, "queue-1")] == [0, 1]


async def test_the_refund_example_itself_refuses_an_approval_not_sent_by_an_operator(
        store, tenancy_settings, tokens):
    """Defence in depth, for an API started without the example loaded: the
    workflow checks the recorded sender itself."""
    from app.store.signals import SignalSender

    fast = tenancy_settings.model_copy(update={"poll_seconds": 0.2})
    running = InProcessWorkers(fast, EXAMPLES)
    try:
        await store.admissions.admit(workflow_id="approve-refund", execution_id="refund-8",
                          params={"order_id": 8, "amount_cents": 100})
        sender = SignalSender(tokens.a.token_id, "tenant-a", "trigger")
        assert await store.signals.send_signal("refund-8", "approval", {"approved": True},
                                       sender=sender) == ("received", None)
        await running.start()
        record = await wait_status(store, "refund-8", "completed", "failed", timeout=30)
    finally:
        await running.stop_all()
    assert record["outcome"]["result"] == {
        "refunded": False, "reason": "the approval did not come from an operator",
        "sentBy": {"tokenId": tokens.a.token_id, "name": "tenant-a", "role": "trigger"}}
