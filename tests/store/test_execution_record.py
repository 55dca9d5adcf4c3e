"""The execution record, store side, against real Postgres: admission, reads,
wakes, claims and acknowledgements, and the outcome each one leaves. Each test
is named after the behaviour it checks (store calls: `admit`, `get`,
`request_wake`, `claim_due`, `acknowledge`; a delivery is a lease: a token and
its expiry). `context` comes back as a plain dict: presenting it read-only is
the SDK's job, not the store's.

Where a behaviour also needs workflow code or a worker, its store side is
tested here (the worker side: tests/sdk/test_dispatch.py):

* A delivery runs from the record, not from the wake: a wake carries only a
  time, and the claim hands over the record's workflowId/params/context.
* A terminal execution delivered again returns its recorded outcome without
  running workflow code: claim_due never returns a terminal record (wakes are
  ignored, backdating changes nothing), and acknowledge on a terminal record
  returns the recorded outcome.
* A delivery that fails with an infrastructure error is released, not
  acknowledged: the status is unchanged and the execution is delivered again.
* Admission writes the record and its first wake in one statement: a failed
  admission (a value that cannot round-trip) leaves neither a record nor
  anything due.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from app.db import create_pool
from app.migrate import upgrade
from app.settings import Settings
from app.store import (
    Acknowledged,
    Admitted,
    Conflict,
    ExecutionStore,
    InvalidEvent,
    ReapResult,
)
from tests.support.admission import admitting
from tests.support.claims import claim, claim_one

LEASE = 30.0  # as `claim` (tests/support/claims.py) takes them
WORKFLOW = "charge-order"


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


admit = admitting(WORKFLOW, params={"orderId": 42})



async def suspended_without_wakes(store: ExecutionStore, execution_id: str) -> None:
    """Admit, deliver once and acknowledge `suspended` with no wake requested:
    the execution is suspended and not due."""
    await admit(store, execution_id)
    d = await claim_one(store, execution_id)
    assert (await store.leases.acknowledge(d.lease, "suspended")).status == "suspended"
    rec = await store.history.get(execution_id)
    assert rec["status"] == "suspended" and rec["due_at"] is None


async def count_rows(pool, table: str) -> int:
    return await pool.fetchval(f"SELECT count(*) FROM {table}")


def same_record(a: dict, b: dict) -> bool:
    skip = {"read_at"}
    return {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


# --------------------------------------------------------------------------- #
# runtime-adapter table: admission
# --------------------------------------------------------------------------- #


async def test_admission_receives_an_unused_caller_supplied_id(store):
    for execution_id in ("order-42", "order/42 ünïcode ✓", "x" * 200):
        result = await store.admissions.admit(
            workflow_id=WORKFLOW, params={"orderId": 42}, execution_id=execution_id
        )
        assert result == Admitted(execution_id, "admitted")
        rec = await store.history.get(execution_id)
        assert rec["execution_id"] == execution_id
        assert rec["workflow_id"] == WORKFLOW


async def test_admission_receives_an_id_in_use(store, pool):
    await admit(store, "order-42", params={"orderId": 42}, context={"tenant": "shop"})
    d = await claim_one(store, "order-42")
    await store.steps.write_step(d.lease, "load-order", value={"status": "open"})
    await store.leases.acknowledge(d.lease, "suspended")
    before = await store.history.get("order-42")
    events_before = await store.history.events("order-42")
    steps_before = await store.history.steps(["order-42"])

    result = await store.admissions.admit(
        workflow_id="another-workflow",
        params={"orderId": 43},
        context={"tenant": "other"},
        execution_id="order-42",
    )

    assert result == Conflict("order-42", "suspended", WORKFLOW)
    assert same_record(await store.history.get("order-42"), before)
    assert await store.history.events("order-42") == events_before
    assert await store.history.steps(["order-42"]) == steps_before
    assert await count_rows(pool, "executions") == 1
    assert await claim(store) == {}  # the conflicting admission made nothing due


@pytest.mark.parametrize("how", ["failed", "released", "lease_expired"])
async def test_delivery_fails_after_admission(store, clock, how):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    if how == "failed":
        await store.leases.acknowledge(d.lease, "failed", error={"name": "CardDeclined", "message": "no"})
    elif how == "released":
        await store.leases.release(d.lease)
    else:
        await clock.expire_lease("order-42")
        assert (await store.leases.reap_expired()).execution_ids == ["order-42"]

    result = await store.admissions.admit(
        workflow_id=WORKFLOW, params={"orderId": 42}, execution_id="order-42"
    )

    assert isinstance(result, Conflict)
    assert result.execution_id == "order-42"
    assert (
        result.status
        == {"failed": "failed", "released": "admitted", "lease_expired": "admitted"}[how]
    )


async def test_admission_omits_an_id(store):
    supplied = {await admit(store, f"order-{i}") for i in range(3)}
    generated = [await admit(store, None) for _ in range(50)]
    assert len(set(generated)) == 50
    assert not supplied & set(generated)
    assert all(isinstance(g, str) and g for g in generated)
    for g in generated[:5]:
        assert (await store.history.get(g))["execution_id"] == g


EVENT_PARAMS = {
    "orderId": 42,
    "big": 2**70,
    "negative": -7,
    "ratio": 0.1,
    "flag": True,
    "nothing": None,
    "text": 'ünïcode ✓ 😀 \t\n"quotes" \\ backslash',
    "nested": {"items": [{"sku": "A-1", "qty": 2}, [], {}], "deep": {"a": {"b": {"c": [1, 2.5]}}}},
    "empty": "",
}
EVENT_CONTEXT = {"tenant": "shop-1", "traceId": "abc", "attempt": 1, "tags": ["x", "y"]}


async def test_admission_stores_an_event(store):
    await admit(store, "order-42", params=EVENT_PARAMS, context=EVENT_CONTEXT)
    await admit(
        store, "no-context", params=[1, "two", {"three": 3}]
    )  # params need not be an object

    rec = await store.history.get("order-42")
    assert rec["workflow_id"] == WORKFLOW
    assert rec["params"] == EVENT_PARAMS
    assert rec["context"] == EVENT_CONTEXT
    assert isinstance(rec["context"], dict)  # read-only view is an SDK concern

    other = await store.history.get("no-context")
    assert other["params"] == [1, "two", {"three": 3}]
    assert other["context"] == {}

    # Every delivery reads the same event, exactly as admitted.
    claimed = await claim(store)
    assert claimed["order-42"].workflow_id == WORKFLOW
    assert claimed["order-42"].params == EVENT_PARAMS
    assert claimed["order-42"].context == EVENT_CONTEXT
    assert claimed["no-context"].context == {}


async def test_a_delivery_runs_reads_workflow_params_and_context_from_the_record(store, pool):
    """Store side of "A delivery runs": a wake names only the execution and a
    time; the claim hands over the record's event."""
    await suspended_without_wakes(store, "order-42")
    await store.operator.request_wake("order-42")
    await store.operator.request_wake("order-42")

    d = await claim_one(store, "order-42")

    assert (d.workflow_id, d.params, d.context) == (WORKFLOW, {"orderId": 42}, {})
    wake_events = [e for e in await store.history.events("order-42") if e["kind"] == "wake_requested"]
    assert len(wake_events) == 2
    assert all(set(e["detail"]) == {"at"} for e in wake_events)  # no event copy anywhere
    tables = {
        r["tablename"]
        for r in await pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    # Flow control's tables hold queue settings and start times, never a wake.
    flow_control = {"queues", "queue_starts", "queue_changes"}
    assert not {t for t in tables - flow_control if "wake" in t or "queue" in t or "timer" in t}


UNSTORABLE = [
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="infinity"),
    pytest.param(float("-inf"), id="minus-infinity"),
    pytest.param("a\u0000b", id="nul-in-string"),
    pytest.param({"k\u0000": 1}, id="nul-in-key"),
    pytest.param("x\ud800", id="lone-high-surrogate"),
    pytest.param("\udcffy", id="lone-low-surrogate"),
    pytest.param({"\ud800": 1}, id="lone-surrogate-in-key"),
    pytest.param([1, {"deep": [float("nan")]}], id="nested-nan"),
]


@pytest.mark.parametrize("where", ["params", "context"])
@pytest.mark.parametrize("bad", UNSTORABLE)
async def test_admission_receives_a_value_that_cannot_round_trip(store, pool, where, bad):
    params = {"orderId": 42, "v": bad} if where == "params" else {"orderId": 42}
    context = {"v": bad} if where == "context" else {}
    with pytest.raises(InvalidEvent):
        await store.admissions.admit(
            workflow_id=WORKFLOW, params=params, context=context, execution_id="order-42"
        )

    assert await store.history.get("order-42") is None
    assert await count_rows(pool, "executions") == 0
    assert await count_rows(pool, "execution_events") == 0
    assert await claim(store) == {}
    # The ID is still free: a valid admission under it succeeds.
    assert await admit(store, "order-42") == "order-42"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(
            "\ud83d\ude00",
            id="surrogate-pair-as-two-code-points",
        ),
        pytest.param(
            1e23,
            id="float-with-exponent",
        ),
    ],
)
@pytest.mark.citus
async def test_admission_stores_an_event_exactly_or_rejects_it(store, pool, value):
    """A value that cannot round-trip is refused (INVALID_EXECUTION_EVENT):
    admission never stores a lossy copy. Either answer is fine; a silently
    changed value is not."""
    params = {"v": value}
    try:
        await store.admissions.admit(workflow_id=WORKFLOW, params=params, execution_id="order-42")
    except InvalidEvent:
        assert await count_rows(pool, "executions") == 0
        return
    got = (await store.history.get("order-42"))["params"]["v"]
    assert type(got) is type(value) and got == value, f"admitted {value!r}, read back {got!r}"


async def test_admission_commits(store, clock):
    result = await store.admissions.admit(
        workflow_id=WORKFLOW, params={"orderId": 42}, execution_id="order-42"
    )
    assert result == Admitted("order-42", "admitted")

    rec = await store.history.get("order-42")
    assert rec["status"] == "admitted"
    assert rec["outcome"] is None
    assert rec["due_at"] == rec["admitted_at"]  # record and first wake: one transaction
    assert rec["due_at"] <= await clock.now()
    assert rec["token"] == 0 and rec["unacknowledged_deliveries"] == 0
    assert [e["kind"] for e in await store.history.events("order-42")] == ["admitted"]

    d = await claim_one(store, "order-42")
    assert d.lease.token == 1


# --------------------------------------------------------------------------- #
# runtime-adapter table: wakes
# --------------------------------------------------------------------------- #


async def test_two_wakes_are_requested_before_a_delivery(store, clock):
    # A suspended execution woken twice.
    await suspended_without_wakes(store, "suspended")
    assert await store.operator.request_wake("suspended") == "requested"
    assert await store.operator.request_wake("suspended") == "requested"
    # Admission is the first wake; two more arrive before any delivery.
    await admit(store, "fresh")
    assert await store.operator.request_wake("fresh") == "requested"
    assert await store.operator.request_wake("fresh", await clock.later(-5)) == "requested"

    first = await claim(store)
    assert sorted(first) == ["fresh", "suspended"]
    assert await claim(store, owner="worker-2") == {}


async def test_wakes_are_requested_with_different_due_times(store, clock):
    await suspended_without_wakes(store, "later-first")
    await suspended_without_wakes(store, "earlier-first")
    t0 = await clock.now()
    for at in (t0 + timedelta(seconds=90), t0 + timedelta(seconds=30), t0 + timedelta(seconds=60)):
        assert await store.operator.request_wake("later-first", at) == "requested"
    for at in (t0 + timedelta(seconds=30), t0 + timedelta(seconds=90), t0 + timedelta(seconds=60)):
        assert await store.operator.request_wake("earlier-first", at) == "requested"

    for eid in ("later-first", "earlier-first"):
        assert (await store.history.get(eid))["due_at"] == t0 + timedelta(seconds=30)
    assert await claim(store) == {}  # not due before the earliest time

    for eid in ("later-first", "earlier-first"):
        await clock.backdate_due(eid, 31)  # 31 s pass
    assert sorted(await claim(store)) == ["earlier-first", "later-first"]


@pytest.mark.parametrize("offset", [0, 60], ids=["wake-due-now", "wake-due-later"])
async def test_a_wake_is_requested_during_a_delivery(store, clock, offset):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    at = await clock.later(offset)
    assert await store.operator.request_wake("order-42", at) == "requested"
    rec = await store.history.get("order-42")
    assert rec["status"] == "running" and rec["due_at"] == at  # kept apart from the covered wake
    assert await claim(store, owner="worker-2") == {}  # the live lease still blocks

    await store.leases.acknowledge(d.lease, "suspended")

    rec = await store.history.get("order-42")
    assert rec["status"] == "suspended"
    assert rec["due_at"] == at
    if offset:
        assert await claim(store) == {}
        await clock.backdate_due("order-42", offset + 1)
    again = await claim_one(store, "order-42", owner="worker-2")
    assert again.lease.token == 2


async def test_a_delivery_claims_a_past_due_wake_and_a_future_wake_is_requested_during_it(
    store, clock
):
    await admit(store, "order-42")
    await clock.backdate_due("order-42", 3600)  # the admission wake is an hour overdue
    d = await claim_one(store, "order-42")
    future = await clock.later(600)
    await store.operator.request_wake("order-42", future)

    await store.leases.acknowledge(d.lease, "suspended")

    rec = await store.history.get("order-42")
    assert rec["due_at"] == future  # not the covered, past time
    assert await claim(store) == {}


async def test_a_wake_is_requested_for_an_unknown_execution_id(store, pool):
    await admit(store, "order-42")
    await claim_one(store, "order-42")

    assert await store.operator.request_wake("no-such-execution") == "not_found"

    assert await store.history.get("no-such-execution") is None
    assert await count_rows(pool, "executions") == 1
    assert await store.history.events("no-such-execution") == []
    assert await claim(store) == {}


async def test_a_delivery_is_claimed_and_not_yet_acknowledged(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")

    assert await claim(store, owner="worker-2") == {}
    await clock.backdate_lease("order-42", LEASE - 2)  # two seconds of the lease left
    assert await claim(store, owner="worker-2") == {}
    await store.operator.request_wake("order-42")  # a new wake does not make it claimable either
    assert await claim(store, owner="worker-2") == {}
    rec = await store.history.get("order-42")
    assert rec["status"] == "running" and rec["token"] == d.lease.token

    # Once the lease has expired (and the redelivery delay passed) it is.
    await clock.expire_lease("order-42")
    assert (await claim_one(store, "order-42", owner="worker-2")).lease.token == d.lease.token + 1


@pytest.mark.parametrize("ended_by", ["takeover", "reaper"])
async def test_a_delivery_is_never_acknowledged(store, clock, ended_by):
    await admit(store, "order-42")
    covered = (await store.history.get("order-42"))["due_at"]
    first = await claim_one(store, "order-42")
    await clock.expire_lease("order-42")

    rec = await store.history.get("order-42")
    assert rec["status"] == "admitted"
    assert rec["due_at"] == covered  # the covered wake is pending again
    if ended_by == "reaper":
        await store.leases.reap_expired()
        assert (await clock.raw("order-42"))["due_at"] == covered

    again = await claim_one(store, "order-42", owner="worker-2")
    assert again.lease.token == first.lease.token + 1
    assert again.unacknowledged_deliveries == 1


@pytest.mark.parametrize("terminal", ["completed", "failed"])
async def test_a_wake_is_requested_for_a_terminal_execution(store, clock, terminal):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    await store.operator.request_wake("order-42", await clock.later(60))  # pending when it ends
    await store.leases.acknowledge(
        d.lease, terminal, result={"ok": True}, error={"name": "E", "message": "m"}
    )
    assert (await store.history.get("order-42"))["due_at"] is None  # terminal clears pending wakes
    events_before = await store.history.events("order-42")

    assert await store.operator.request_wake("order-42") == "ignored"
    assert await store.operator.request_wake("order-42", await clock.later(-60)) == "ignored"

    rec = await store.history.get("order-42")
    assert rec["status"] == terminal and rec["due_at"] is None
    assert await store.history.events("order-42") == events_before
    assert await claim(store) == {}


async def test_the_runtime_restarts_with_admitted_and_suspended_executions(
    store, settings, open_pool, clock
):
    await suspended_without_wakes(store, "suspended-woken")
    wake_at = await clock.later(120)
    await store.operator.request_wake("suspended-woken", wake_at)
    await suspended_without_wakes(store, "suspended-idle")
    await admit(store, "admitted")
    before = {
        eid: await store.history.get(eid) for eid in ("admitted", "suspended-woken", "suspended-idle")
    }

    await store.pool.close()  # the runtime goes away; a new one connects
    new_pool = await open_pool(max_size=4)
    restarted = ExecutionStore.from_settings(new_pool, settings)

    for eid, rec in before.items():
        assert same_record(await restarted.history.get(eid), rec)
    assert (await restarted.history.get("suspended-woken"))["due_at"] == wake_at
    assert list(await claim(restarted)) == ["admitted"]
    await new_pool.execute(
        "UPDATE executions SET due_at = due_at - interval '121 seconds' WHERE execution_id = 'suspended-woken'"
    )
    assert list(await claim(restarted)) == ["suspended-woken"]
    assert (await restarted.history.get("suspended-idle"))["status"] == "suspended"


async def test_the_runtime_restarts_with_admitted_and_suspended_executions_across_a_server_restart(
    embedded_server,
):
    """The same row, with the Postgres server itself stopped and started again
    (a private embedded server; clean 'fast' stop) between the two runtimes."""
    url = embedded_server.url
    await upgrade(url)
    settings = Settings(database_url=url)
    pool = await create_pool(settings, max_size=2)
    try:
        store = ExecutionStore.from_settings(pool, settings)
        await suspended_without_wakes(store, "suspended")
        await store.operator.request_wake("suspended")
        await admit(store, "admitted")
        before = {eid: await store.history.get(eid) for eid in ("admitted", "suspended")}
    finally:
        await pool.close()

    await asyncio.to_thread(embedded_server.restart)

    pool = await create_pool(settings, max_size=2)
    try:
        store = ExecutionStore.from_settings(pool, settings)
        for eid, rec in before.items():
            after = await store.history.get(eid)
            assert after["status"] == rec["status"]
            assert after["due_at"] == rec["due_at"]
            assert (after["params"], after["context"]) == (rec["params"], rec["context"])
        assert sorted(await claim(store)) == ["admitted", "suspended"]
    finally:
        await pool.close()


# --------------------------------------------------------------------------- #
# outcome table
# --------------------------------------------------------------------------- #


async def test_a_delivery_acknowledges_suspended(store):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")

    assert await store.leases.acknowledge(d.lease, "suspended") == Acknowledged("suspended", None)

    rec = await store.history.get("order-42")
    assert rec["status"] == "suspended"
    assert rec["outcome"] is None
    assert rec["lease_owner"] is None and rec["lease_expires_at"] is None


async def test_a_delivery_acknowledges_completed(store):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    result = {"charged": True, "receipt": "r-1", "amount": 12.5}

    ack = await store.leases.acknowledge(d.lease, "completed", result=result)

    assert ack == Acknowledged("completed", {"result": result})
    rec = await store.history.get("order-42")
    assert rec["status"] == "completed"
    assert rec["outcome"] == {"result": result}
    assert rec["due_at"] is None and rec["lease_expires_at"] is None


async def test_a_delivery_acknowledges_failed(store, settings, open_pool):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    error = {"name": "CardDeclined", "message": "insufficient funds", "code": "E51"}

    ack = await store.leases.acknowledge(d.lease, "failed", error=error)

    assert ack.status == "failed"
    for reader in (store, ExecutionStore.from_settings(await open_pool(), settings)):
        rec = await reader.history.get("order-42")
        assert rec["status"] == "failed"
        assert rec["outcome"]["error"]["name"] == "CardDeclined"
        assert rec["outcome"]["error"]["message"] == "insufficient funds"

    # An error without details still records a name and a message.
    await admit(store, "order-43")
    d = await claim_one(store, "order-43")
    await store.leases.acknowledge(d.lease, "failed")
    err = (await store.history.get("order-43"))["outcome"]["error"]
    assert {"name", "message"} <= set(err)


@pytest.mark.parametrize("first", ["completed", "failed"])
async def test_a_second_terminal_acknowledgement_differs_from_the_first(store, first):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    first_ack = await store.leases.acknowledge(
        d.lease, first, result={"receipt": "r-1"}, error={"name": "First", "message": "first"}
    )
    recorded = await store.history.get("order-42")

    for status, kw in (
        ("completed", {"result": {"receipt": "r-2"}}),
        ("failed", {"error": {"name": "Second", "message": "second"}}),
    ):
        again = await store.leases.acknowledge(d.lease, status, **kw)
        assert again == first_ack

    assert same_record(await store.history.get("order-42"), recorded)
    assert [e["kind"] for e in await store.history.events("order-42")].count("acknowledged") == 1


@pytest.mark.parametrize("terminal", ["completed", "failed"])
async def test_a_suspended_acknowledgement_arrives_after_a_terminal_one(store, terminal):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    first_ack = await store.leases.acknowledge(
        d.lease, terminal, result={"receipt": "r-1"}, error={"name": "E", "message": "m"}
    )
    recorded = await store.history.get("order-42")

    assert await store.leases.acknowledge(d.lease, "suspended") == first_ack

    rec = await store.history.get("order-42")
    assert same_record(rec, recorded)
    assert rec["status"] == terminal


@pytest.mark.parametrize("terminal", ["completed", "failed"])
async def test_a_terminal_execution_is_delivered_again(store, clock, terminal):
    """Store side only (see the module docstring): a terminal record is never
    handed out again, and acknowledging it returns the recorded outcome."""
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    recorded = await store.leases.acknowledge(
        d.lease, terminal, result={"receipt": "r-1"}, error={"name": "E", "message": "m"}
    )

    assert await store.operator.request_wake("order-42") == "ignored"
    await clock.backdate_due("order-42", 3600)
    assert await claim(store) == {}
    assert await store.leases.reap_expired() == ReapResult(0, [])

    assert await store.leases.acknowledge(d.lease, "suspended") == recorded
    assert await store.leases.acknowledge(d.lease, "completed", result="other") == recorded
    rec = await store.history.get("order-42")
    assert rec["status"] == terminal and rec["token"] == d.lease.token


async def test_a_delivery_fails_with_an_infrastructure_error(store, clock):
    """The worker releases (never acknowledges) on an infrastructure error."""
    await suspended_without_wakes(store, "order-42")
    wake_at = await clock.later(-1)
    await store.operator.request_wake("order-42", wake_at)
    before = await store.history.get("order-42")
    d = await claim_one(store, "order-42")

    await store.leases.release(d.lease)

    rec = await store.history.get("order-42")
    assert rec["status"] == before["status"] == "suspended"
    assert rec["outcome"] is None
    assert rec["due_at"] == wake_at  # its wake stays pending
    assert await claim(store) == {}  # not before the redelivery delay
    await clock.backdate_redelivery("order-42", 3600)
    again = await claim_one(store, "order-42", owner="worker-2")
    assert again.lease.token == d.lease.token + 1
