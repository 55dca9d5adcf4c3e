"""ExecutionStore details beyond the execution record and lease rules, against real Postgres:
healed reads, the reaper, operator listing and its cursor, the event history,
late observations, unstorable values, and claim_due's query plan.
"""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import pytest

from app.db import asyncpg_dsn, create_pool
from app.reaper import LeaseReaper
from app.store import (
    ExecutionStore,
    InvalidEvent,
    LeaseLost,
    decode_cursor,
)
from app.store.placement import read_placement
from tests.support.admission import admitting
from tests.support.claims import claim_one

LEASE = 30.0

# The fields a healed read reports and the reaper must then write.
HEALED_FIELDS = (
    "status",
    "unacknowledged_deliveries",
    "due_at",
    "last_unacknowledged_at",
    "redeliver_after",
    "lease_owner",
    "lease_expires_at",
    "token",
    "outcome",
)


admit = admitting("w", params=lambda execution_id: {"id": execution_id})



def pick(rec: dict, fields=HEALED_FIELDS) -> dict:
    return {k: rec[k] for k in fields}


# --------------------------------------------------------------------------- #
# healed reads and the reaper
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("earlier", ["none", "suspended"])
async def test_a_read_heals_an_expired_lease_before_the_reaper_writes_the_same(
    store, clock, earlier
):
    await admit(store, "order-42")
    if earlier == "suspended":
        d = await claim_one(store, "order-42")
        await store.leases.acknowledge(d.lease, "suspended")
        await store.operator.request_wake("order-42")
    covered = (await store.history.get("order-42"))["due_at"]
    d = await claim_one(store, "order-42", owner="worker-A")
    wake_during = await clock.later(300)
    await store.operator.request_wake("order-42", wake_during)  # pending, apart from the covered wake
    await clock.expire_lease("order-42", ago=10)
    expired_at = (await clock.raw("order-42"))["lease_expires_at"]

    healed = await store.history.get("order-42")

    assert (await clock.raw("order-42"))["status"] == "running"  # nothing written yet
    assert healed["status"] == ("suspended" if earlier == "suspended" else "admitted")
    assert healed["lease_expired"] is True
    assert healed["unacknowledged_deliveries"] == 1
    assert healed["lease_owner"] is None and healed["lease_expires_at"] is None
    assert healed["due_at"] == min(covered, wake_during)
    assert healed["last_unacknowledged_at"] == expired_at
    assert healed["redeliver_after"] == expired_at + timedelta(seconds=1)
    assert healed["token"] == d.lease.token
    # The listing filters on the healed view too.
    assert [r["execution_id"] for r in (await store.history.list(status=healed["status"]))[0]] == [
        "order-42"
    ]
    assert (await store.history.list(status="running"))[0] == []
    assert len((await store.history.list(min_unacknowledged_deliveries=1))[0]) == 1

    result = await LeaseReaper(store).run_once()

    assert result.execution_ids == ["order-42"]
    raw = await clock.raw("order-42")
    assert pick(raw) == pick(healed)
    after = await store.history.get("order-42")
    assert pick(after) == pick(healed)
    assert after["lease_expired"] is False
    expired_events = [e for e in await store.history.events("order-42") if e["kind"] == "lease_expired"]
    assert len(expired_events) == 1 and expired_events[0]["token"] == d.lease.token


async def test_a_live_lease_is_not_healed(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    await clock.backdate_lease("order-42", LEASE - 2)  # two seconds left
    rec = await store.history.get("order-42")
    assert rec["status"] == "running" and rec["lease_expired"] is False
    assert rec["lease_owner"] == "worker-1" and rec["lease_expires_at"] is not None
    assert rec["unacknowledged_deliveries"] == 0
    assert (await LeaseReaper(store).run_once()).expired == 0
    assert (await store.leases.renew([d.lease], LEASE))[0]


async def test_reaper_run_once_counts_every_expired_lease_across_batches(store, clock):
    expired = [f"expired-{i}" for i in range(7)]
    live = [f"live-{i}" for i in range(2)]
    for eid in expired + live:
        await admit(store, eid)
        await claim_one(store, eid)
    for eid in expired:
        await clock.expire_lease(eid, ago=5)
    await admit(store, "waiting")  # admitted, never leased

    result = await LeaseReaper(store, batch=3).run_once()

    assert result.expired == 7
    assert sorted(result.execution_ids) == sorted(expired)
    for eid in expired:
        raw = await clock.raw(eid)
        assert raw["status"] == "admitted" and raw["unacknowledged_deliveries"] == 1
        assert raw["lease_expires_at"] is None
    for eid in live:
        assert (await clock.raw(eid))["status"] == "running"
    assert (await LeaseReaper(store, batch=3).run_once()).expired == 0
    # A batch size equal to the count: one full batch, then a short (empty) one.
    await store.pool.execute(
        "UPDATE executions SET redeliver_after = NULL WHERE execution_id LIKE 'expired-%'"
    )
    again = await store.leases.claim_due(3, LEASE, "worker-2")
    for d in again:
        await clock.expire_lease(d.lease.execution_id)
    assert (await LeaseReaper(store, batch=3).run_once()).expired == 3


def test_reaper_rejects_a_non_positive_interval_or_batch(store):
    with pytest.raises(ValueError):
        LeaseReaper(store, interval=0)
    with pytest.raises(ValueError):
        LeaseReaper(store, batch=0)


# --------------------------------------------------------------------------- #
# operator listing
# --------------------------------------------------------------------------- #


async def build_listing_fixture(store: ExecutionStore, clock) -> None:
    """alpha-admitted, alpha-running, alpha-suspended, beta-completed,
    beta-failed, beta-retried (admitted, 2 releases), beta-expired (running
    with an expired lease: healed admitted, 1 unacknowledged)."""
    await admit(store, "alpha-running", workflow_id="alpha")
    await claim_one(store, "alpha-running")
    await admit(store, "alpha-suspended", workflow_id="alpha")
    d = await claim_one(store, "alpha-suspended")
    await store.leases.acknowledge(d.lease, "suspended")
    await admit(store, "beta-completed", workflow_id="beta")
    d = await claim_one(store, "beta-completed")
    await store.leases.acknowledge(d.lease, "completed", result=1)
    await admit(store, "beta-failed", workflow_id="beta")
    d = await claim_one(store, "beta-failed")
    await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})
    await admit(store, "beta-retried", workflow_id="beta")
    for _ in range(2):
        d = await claim_one(store, "beta-retried")
        await store.leases.release(d.lease)
        await clock.backdate_redelivery("beta-retried", 3600)
    await store.pool.execute(
        "UPDATE executions SET redeliver_after = now() + interval '1 hour' WHERE execution_id = 'beta-retried'"
    )
    await admit(store, "beta-expired", workflow_id="beta")
    await claim_one(store, "beta-expired")
    await clock.expire_lease("beta-expired", ago=0.1)
    await admit(store, "alpha-admitted", workflow_id="alpha")


async def listed(store: ExecutionStore, **filters) -> set[str]:
    page, cursor = await store.history.list(limit=100, **filters)
    assert cursor is None
    return {r["execution_id"] for r in page}


async def test_list_filters_by_status_workflow_and_unacknowledged_deliveries(store, clock):
    await build_listing_fixture(store, clock)

    assert await listed(store) == {
        "alpha-admitted",
        "alpha-running",
        "alpha-suspended",
        "beta-completed",
        "beta-failed",
        "beta-retried",
        "beta-expired",
    }
    assert await listed(store, status="admitted") == {
        "alpha-admitted",
        "beta-retried",
        "beta-expired",
    }
    assert await listed(store, status="running") == {"alpha-running"}
    assert await listed(store, status="suspended") == {"alpha-suspended"}
    assert await listed(store, status="completed") == {"beta-completed"}
    assert await listed(store, status="failed") == {"beta-failed"}
    assert await listed(store, status="parked") == set()
    assert await listed(store, workflow_id="alpha") == {
        "alpha-admitted",
        "alpha-running",
        "alpha-suspended",
    }
    assert await listed(store, workflow_id="nope") == set()
    assert await listed(store, min_unacknowledged_deliveries=1) == {"beta-retried", "beta-expired"}
    assert await listed(store, min_unacknowledged_deliveries=2) == {"beta-retried"}
    assert await listed(store, min_unacknowledged_deliveries=3) == set()
    assert len(await listed(store, min_unacknowledged_deliveries=0)) == 7
    assert await listed(store, workflow_id="beta", status="admitted") == {
        "beta-retried",
        "beta-expired",
    }
    assert await listed(store, workflow_id="alpha", min_unacknowledged_deliveries=1) == set()
    assert await listed(
        store, workflow_id="beta", status="admitted", min_unacknowledged_deliveries=2
    ) == {"beta-retried"}
    rec = {r["execution_id"]: r for r in (await store.history.list(limit=100))[0]}
    assert rec["beta-retried"]["unacknowledged_deliveries"] == 2
    assert rec["beta-expired"]["unacknowledged_deliveries"] == 1


async def walk(store: ExecutionStore, limit: int, **filters) -> tuple[list[str], int]:
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        page, cursor = await store.history.list(limit=limit, cursor=cursor, **filters)
        pages += 1
        assert len(page) <= limit
        ids += [r["execution_id"] for r in page]
        if cursor is None:
            return ids, pages
        assert len(page) == limit
        assert pages < 100


@pytest.mark.parametrize("total", [20, 23])
async def test_list_keyset_pagination_has_no_duplicates_or_gaps(store, pool, total):
    for i in range(total):
        await admit(store, f"exec-{i:02d}", workflow_id="even" if i % 2 == 0 else "odd")
    # Ties on admitted_at must be broken by execution_id, across page borders.
    await pool.execute(
        "UPDATE executions SET admitted_at = (SELECT min(admitted_at) FROM executions) "
        "WHERE execution_id IN ('exec-03', 'exec-04', 'exec-05', 'exec-06', 'exec-07', 'exec-08')"
    )
    expected = [
        r["execution_id"]
        for r in await pool.fetch(
            "SELECT execution_id FROM executions ORDER BY admitted_at DESC, execution_id DESC"
        )
    ]

    ids, pages = await walk(store, 5)

    assert ids == expected  # newest first, every row exactly once
    assert len(set(ids)) == total
    assert pages == -(-total // 5)

    even, _ = await walk(store, 3, workflow_id="even")
    assert even == [e for e in expected if int(e[-2:]) % 2 == 0]


async def test_list_pagination_is_stable_while_executions_are_admitted(store, pool):
    for i in range(12):
        await admit(store, f"old-{i:02d}")
    first, cursor = await store.history.list(limit=4)
    for i in range(5):
        await admit(store, f"new-{i}")  # newer than every listed row
    rest = [r["execution_id"] for r in first]
    while cursor:
        page, cursor = await store.history.list(limit=4, cursor=cursor)
        rest += [r["execution_id"] for r in page]
    assert sorted(rest) == [f"old-{i:02d}" for i in range(12)]
    assert len(rest) == 12


def _b64(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor!",
        "%%%%",
        _b64(b"not json"),
        _b64(b"[1]"),
        _b64(b'{"a": 1}'),
        _b64(json.dumps(["not-a-date", "x"]).encode()),
        _b64(json.dumps([1, 2, 3]).encode()),
        _b64(json.dumps([None, "x"]).encode()),
    ],
)
async def test_list_with_an_invalid_cursor_raises_value_error(store, cursor):
    await admit(store, "order-42")
    with pytest.raises(ValueError):
        await store.history.list(cursor=cursor)
    with pytest.raises(ValueError):
        decode_cursor(cursor)


# --------------------------------------------------------------------------- #
# the event history
# --------------------------------------------------------------------------- #


async def test_events_are_written_with_each_transition(store, clock):
    eid = await admit(store, "order-42")
    d1 = await claim_one(store, eid, owner="w1")
    await store.steps.write_step(d1.lease, "load", value=1)
    await store.steps.write_step(d1.lease, "load", value=2)  # idempotent rewrite: no event
    await store.leases.acknowledge(d1.lease, "suspended")
    await store.operator.request_wake(eid)
    d2 = await claim_one(store, eid, owner="w2")
    await store.leases.release(d2.lease)
    await clock.backdate_redelivery(eid, 3600)
    d3 = await claim_one(store, eid, owner="w3")
    await clock.expire_lease(eid)
    await store.leases.reap_expired()
    await store.leases.renew([d3.lease], LEASE)  # after the reaper: lost
    with pytest.raises(LeaseLost):
        await store.steps.write_step(d3.lease, "charge", value="late")
    await clock.backdate_redelivery(eid, 3600)
    d4 = await claim_one(store, eid, owner="w4")
    await clock.expire_lease(eid)
    d5 = await claim_one(store, eid, owner="w5")  # takeover: lease_expired + claimed
    await store.leases.acknowledge(d5.lease, "completed", result="done")

    events = await store.history.events(eid)
    assert [(e["kind"], e["token"]) for e in events] == [
        ("admitted", None),
        ("claimed", 1),
        ("step_recorded", 1),
        ("acknowledged", 1),
        ("wake_requested", None),
        ("claimed", 2),
        ("released", 2),
        ("claimed", 3),
        ("lease_expired", 3),
        ("renewal_lost", 3),
        ("fenced_write_rejected", 3),
        ("claimed", 4),
        ("lease_expired", 4),
        ("claimed", 5),
        ("acknowledged", 5),
    ]
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    ats = [e["at"] for e in events]
    assert ats == sorted(ats)
    detail = {(e["kind"], e["token"]): e["detail"] for e in events}
    assert detail[("admitted", None)] == {"workflowId": "w"}
    assert detail[("claimed", 4)] == {"owner": "w4"}
    assert detail[("step_recorded", 1)]["stepKey"] == "load"
    assert detail[("acknowledged", 1)]["status"] == "suspended"
    assert detail[("acknowledged", 5)]["status"] == "completed"
    assert detail[("released", 2)]["unacknowledgedDeliveries"] == 1
    assert detail[("lease_expired", 4)]["owner"] == "w4"
    assert detail[("fenced_write_rejected", 3)] == {"stepKey": "charge"}
    assert d4.lease.token == 4


async def test_events_of_other_executions_are_not_mixed_in(store):
    await admit(store, "a")
    await admit(store, "b")
    assert [e["kind"] for e in await store.history.events("a")] == ["admitted"]
    assert await store.history.events("missing") == []


# --------------------------------------------------------------------------- #
# late observations
# --------------------------------------------------------------------------- #


async def test_late_observations_are_appended_and_change_no_state(store, clock):
    await admit(store, "order-42")
    a = await claim_one(store, "order-42", owner="worker-A")
    await clock.expire_lease("order-42")
    b = await claim_one(store, "order-42", owner="worker-B")
    await store.steps.write_step(b.lease, "charge-card", value={"receipt": "by-B"})
    with pytest.raises(LeaseLost):
        await store.steps.write_step(a.lease, "charge-card", value={"receipt": "by-A"})
    record = await store.history.get("order-42")
    steps = await store.history.steps(["order-42"])
    events = await store.history.events("order-42")

    await store.steps.record_late_observation(a.lease, "charge-card", value={"receipt": "by-A"})
    await store.steps.record_late_observation(a.lease, None, error={"name": "Timeout", "message": "slow"})
    await store.steps.record_late_observation(a.lease, "charge-card", value={"bad": float("nan")})
    await store.steps.record_late_observation(a.lease, "charge-card", value="nul\u0000")

    observed = await store.history.late_observations("order-42")
    assert [(o["step_key"], o["token"], o["owner"]) for o in observed] == [
        ("charge-card", a.lease.token, "worker-A"),
        (None, a.lease.token, "worker-A"),
        ("charge-card", a.lease.token, "worker-A"),
        ("charge-card", a.lease.token, "worker-A"),
    ]
    assert observed[0]["value"] == {"receipt": "by-A"} and observed[0]["error"] is None
    assert observed[1]["error"] == {"name": "Timeout", "message": "slow"}
    for unstorable in observed[2:]:  # kept as evidence that something arrived
        assert unstorable["value"] is None
        assert unstorable["error"]["name"] == "UnstorableValue"
    ids = [o["observation_id"] for o in observed]
    assert ids == sorted(ids)

    # Nothing applied. The first observation differs from B's recorded value:
    # an integrity conflict, counted on the record and told by one event.
    assert [o["conflict"] for o in observed[:2]] == [True, None]
    after = await store.history.get("order-42")
    assert after["integrity_conflicts"] == 1
    assert {k: v for k, v in after.items() if k not in ("read_at", "integrity_conflicts")} == {
        k: v for k, v in record.items() if k not in ("read_at", "integrity_conflicts")
    }
    assert await store.history.steps(["order-42"]) == steps
    later = await store.history.events("order-42")
    assert later[:len(events)] == events
    assert [(e["kind"], e["token"], e["detail"]["stepKey"]) for e in later[len(events):]] == [
        ("integrity_conflict", a.lease.token, "charge-card")]
    assert await store.history.late_observations("other") == []


# --------------------------------------------------------------------------- #
# values Postgres cannot store exactly
# --------------------------------------------------------------------------- #

UNSTORABLE = [
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="infinity"),
    pytest.param("a\u0000b", id="nul"),
    pytest.param({"\u0000": 1}, id="nul-key"),
    pytest.param("\ud800", id="lone-surrogate"),
]


@pytest.mark.parametrize("bad", UNSTORABLE)
async def test_admission_of_an_unstorable_value_writes_no_row_and_no_event(store, pool, bad):
    with pytest.raises(InvalidEvent):
        await store.admissions.admit(workflow_id="w", params={"v": bad}, execution_id="order-42")
    with pytest.raises(InvalidEvent):
        await store.admissions.admit(workflow_id="w", params={}, context={"v": bad}, execution_id="order-43")
    assert await pool.fetchval("SELECT count(*) FROM executions") == 0
    assert await pool.fetchval("SELECT count(*) FROM execution_events") == 0


@pytest.mark.parametrize("field", ["value", "error"])
@pytest.mark.parametrize("bad", UNSTORABLE)
async def test_a_step_with_an_unstorable_value_writes_no_row_and_no_event(store, pool, bad, field):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    events_before = await store.history.events("order-42")
    payload = (
        {"value": {"v": bad}} if field == "value" else {"error": {"name": "E", "message": bad}}
    )

    with pytest.raises(InvalidEvent):
        await store.steps.write_step(d.lease, "charge-card", **payload)

    assert await pool.fetchval("SELECT count(*) FROM execution_steps") == 0
    assert await store.history.events("order-42") == events_before
    # The delivery can go on: the lease is untouched.
    assert (await store.steps.write_step(d.lease, "charge-card", value="ok")).value == "ok"


@pytest.mark.parametrize("bad", UNSTORABLE)
async def test_acknowledging_an_unstorable_result_changes_nothing(store, bad):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    before = await store.history.get("order-42")
    events_before = await store.history.events("order-42")

    with pytest.raises((InvalidEvent, ValueError, asyncpg.DataError)):
        await store.leases.acknowledge(d.lease, "completed", result={"v": bad})

    after = await store.history.get("order-42")
    assert pick(after) == pick(before)
    assert await store.history.events("order-42") == events_before
    assert (await store.leases.acknowledge(d.lease, "completed", result="ok")).status == "completed"


@pytest.mark.parametrize(
    "outcome",
    [
        pytest.param(("completed", {"result": "a\u0000b"}), id="completed-nul"),
        pytest.param(("completed", {"result": "\ud800"}), id="completed-lone-surrogate"),
        pytest.param(("completed", {"result": float("nan")}), id="completed-nan"),
        pytest.param(
            ("failed", {"error": {"name": "ValueError", "message": "bad byte \u0000"}}),
            id="failed-nul-in-message",
        ),
    ],
)
async def test_acknowledging_an_unstorable_outcome_raises_invalid_event(store, outcome):
    status, kw = outcome
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    with pytest.raises(InvalidEvent):
        await store.leases.acknowledge(d.lease, status, **kw)


# --------------------------------------------------------------------------- #
# claim_due stays an index scan
# --------------------------------------------------------------------------- #


class CapturingPool:
    """Stands in for the pool: records the statement a store method would run."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    async def fetch(self, sql, *args):
        self.calls.append((sql, args))
        return []

    # Store methods that run in a transaction take a connection first.
    def acquire(self):
        return self

    def transaction(self):
        return self

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(sql_literal(v) for v in value) + "]::text[]"
    raise TypeError(value)


async def explain(conn, sql: str, args: tuple, generic: bool = False) -> list[dict]:
    """EXPLAIN the statement with its real arguments: as a custom plan (what
    the first executions of a prepared statement get), or as the generic plan
    the plan cache may switch to after five executions."""
    if not generic:
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    else:
        await conn.execute(f"PREPARE fp_explained AS {sql}")
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            literals = ", ".join(sql_literal(a) for a in args)
            raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE fp_explained({literals})")
        finally:
            await conn.execute("DEALLOCATE fp_explained; RESET plan_cache_mode")
    plan = json.loads(raw) if isinstance(raw, str) else raw
    return list(plan_nodes(plan[0]["Plan"]))


async def seed_large_table(pool) -> None:
    await pool.execute(
        """
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, outcome, token,
                                admitted_at)
        SELECT 'done-' || g, fencepost_bucket('done-' || g), 'w', '{}', CASE WHEN g % 3 = 0 THEN 'failed' ELSE 'completed' END,
               '{"result": 1}', 1, now() - make_interval(secs => g)
        FROM generate_series(1, 20000) g;
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, due_at,
                                parked_reason)
        SELECT 'parked-' || g, fencepost_bucket('parked-' || g), 'w', '{}', 'parked', now() - interval '1 hour', 'poison'
        FROM generate_series(1, 200) g;
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, due_at)
        SELECT 'suspended-' || g, fencepost_bucket('suspended-' || g), 'w', '{}', 'suspended',
               NULL FROM generate_series(1, 200) g;
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, token,
                                lease_owner, lease_expires_at)
        SELECT 'live-' || g, fencepost_bucket('live-' || g), 'w', '{}', 'running', 1, 'other', now() + interval '1 minute'
        FROM generate_series(1, 50) g;
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, token,
                                lease_owner, lease_expires_at, covered_due_at)
        SELECT 'expired-' || g, fencepost_bucket('expired-' || g), 'w', '{}', 'running', 1, 'gone', now() - interval '1 hour',
               now() - interval '2 hours'
        FROM generate_series(1, 2) g;
        INSERT INTO executions (execution_id, bucket, workflow_id, params, status, due_at)
        SELECT 'due-' || g, fencepost_bucket('due-' || g), 'w', '{}', 'admitted', now() - make_interval(secs => g)
        FROM generate_series(1, 3) g;
        ANALYZE executions;
        """
    )


@pytest.mark.parametrize("method", ["claim_due", "reap_expired"])
async def test_claim_due_stays_an_index_scan_on_a_large_table(store, pool, settings, method):
    await seed_large_table(pool)
    capture = CapturingPool()
    spy = ExecutionStore.from_settings(capture, settings)
    # Where the buckets live is read from the real database, as the store
    # would at first need; the spy records only the statement under test.
    spy.config.placement.placement = await read_placement(pool)
    if method == "claim_due":
        await spy.leases.claim_due(10, LEASE, "worker-1")
    else:
        await spy.leases.reap_expired(500)
    [(sql, args)] = capture.calls  # the full statement the store would run

    async with pool.acquire() as conn:
        plans = {
            "custom": await explain(conn, sql, args),
            "generic": await explain(conn, sql, args, generic=True),
        }

    for kind, nodes in plans.items():
        seq = [
            n
            for n in nodes
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "executions"
        ]
        assert not seq, f"{kind} plan of {method} scans executions sequentially: {seq}"
        indexes = {n.get("Index Name") for n in nodes}
        if method == "claim_due":
            assert {"ix_executions_due", "ix_executions_lease_expiry"} <= indexes, (kind, indexes)
        else:
            assert "ix_executions_lease_expiry" in indexes, (kind, indexes)

    # And the statement does what it should on that table.
    if method == "claim_due":
        got = await store.leases.claim_due(10, LEASE, "worker-1")
        assert sorted(d.lease.execution_id for d in got) == [
            "due-1",
            "due-2",
            "due-3",
            "expired-1",
            "expired-2",
        ]
    else:
        assert sorted((await store.leases.reap_expired(500)).execution_ids) == ["expired-1", "expired-2"]


async def test_the_pool_never_jit_compiles_a_statement(database_url, settings):
    """A claim's queue-limits function JIT-compiled a one-row query on every
    claim once the executions table grew (its generic plan's estimate
    crossed jit_above_cost): ~70 ms of CPU per claim on a Postgres built with
    JIT, which starved a two-CPU machine (CI's soak). Fencepost's statements
    are short; compiling one never pays. The pool's sessions run without JIT
    even where the database asks for it on every statement."""
    admin = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        name = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'ALTER DATABASE "{name}" SET jit = on')
        await admin.execute(f'ALTER DATABASE "{name}" SET jit_above_cost = 0')
    finally:
        await admin.close()
    pool = await create_pool(settings)
    try:
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT current_setting('jit_above_cost')") == "0"
            assert await conn.fetchval("SELECT current_setting('jit')") == "off"
    finally:
        await pool.close()
