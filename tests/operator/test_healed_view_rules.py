"""Issue 10 item 14, one rule in one place: the API, the dashboard (listing
filter, execution page) and the metrics agree on `blockedBy` for every value
(waiting-for-child included), and an expired lease reads as the reaper will
leave it (cancel, deadline, poison), before the reaper has written it."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
import httpx
import pytest

from app.blocked import blocked_by, carried
from app.reaper import LeaseReaper
from app.store import ExecutionStore
from app.ui import views
from tests.support.admission import admit
from tests.support.responses import get_record

pytestmark = pytest.mark.timeout(60)

# Why an execution is not running now (blockedBy.reason), the child wait
# included; "none" stands for terminal.
REASONS = ("none", "parked", "leased", "lease-expired", "redelivery-delay", "delayed-start",
           "sleeping",
           "waiting-for-signal", "waiting-for-child", "queue-paused", "concurrency-limit",
           "rate-limited", "no-worker", "no-worker-for-version", "due")

LIVE_WORKFLOWS = ["op-quick", "op-sleep", "op-gated", "op-charge", "op-w1", "op-w2", "op-w3",
                  "op-w4", "op-w5", "op-w6", "op-w7", "op-w8", "op-versioned"]


async def _claim(store: ExecutionStore, workflow_id: str):
    [d] = await store.leases.claim_due(1, 30, "holder-1", [workflow_id])
    return d.lease


async def _one_per_reason(store: ExecutionStore, pool: asyncpg.Pool) -> dict[str, str]:
    """{execution_id: the blockedBy reason it must read}: one per reason."""
    # r-leased holds the one slot of q-one; r-done's start spends q-rate's
    # one start per hour; q-paused is paused.
    await store.queues.change("q-one", {"concurrency": 1}, actor="test")
    await store.queues.change("q-rate", {"rate_limit": 1, "rate_period": 3600.0}, actor="test")
    await store.queues.change("q-paused", {"paused": True}, actor="test")
    await store.workers.register_worker("w-live", host="t", pid=1, workflows=LIVE_WORKFLOWS,
                                concurrency=1, versions={"op-versioned": "v2"})
    now = await store.clock.db_now()
    await admit(store, "op-w1", "r-leased", queue="q-one")
    await _claim(store, "op-w1")
    await admit(store, "op-w2", "r-expired")
    await _claim(store, "op-w2")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = 'r-expired'")
    await admit(store, "op-w3", "r-delay")
    await store.leases.release(await _claim(store, "op-w3"))
    await pool.execute("UPDATE executions SET redeliver_after = now() + interval '1 hour' "
                       "WHERE execution_id = 'r-delay'")
    await admit(store, "op-w4", "r-sleeping")
    lease = await _claim(store, "op-w4")
    await store.operator.request_wake("r-sleeping", now + timedelta(hours=1))
    await store.leases.acknowledge(lease, "suspended", waiting_on={"sleep": "nap"})
    await admit(store, "op-w5", "r-signal")
    await store.leases.acknowledge(await _claim(store, "op-w5"), "suspended",
                            waiting_on={"signal": "approve"})
    await admit(store, "op-w6", "r-parent")
    await store.leases.acknowledge(await _claim(store, "op-w6"), "suspended",
                            waiting_on={"child": "r-parent~child"})
    await admit(store, "op-w7", "r-parked")
    await store.effects.begin_effect(await _claim(store, "op-w7"), "charge", idempotency_key="k",
                             function_name="remote")
    await pool.execute("UPDATE executions SET status = 'parked', parked_reason = 'poison', "
                       "lease_owner = NULL, lease_expires_at = NULL, due_at = NULL "
                       "WHERE execution_id = 'r-parked'")
    await admit(store, "op-w8", "r-done", queue="q-rate")
    await store.leases.acknowledge(await _claim(store, "op-w8"), "completed", result={"ok": 1})
    await admit(store, "op-quick", "r-due")
    await admit(store, "op-nobody-runs-this", "r-no-worker")
    await admit(store, "op-quick", "r-queue-paused", queue="q-paused")
    await admit(store, "op-quick", "r-concurrency", queue="q-one")
    await admit(store, "op-quick", "r-rate", queue="q-rate")
    await admit(store, "op-quick", "r-delayed", delay_seconds=3600)
    # Its workflow runs on a live worker, but at v2, not the v1 it was admitted under.
    await admit(store, "op-versioned", "r-version", code_version="v1")
    return {
        "r-version": "no-worker-for-version",
        "r-delayed": "delayed-start",
        "r-queue-paused": "queue-paused", "r-concurrency": "concurrency-limit",
        "r-rate": "rate-limited",
        "r-leased": "leased", "r-expired": "lease-expired", "r-delay": "redelivery-delay",
        "r-sleeping": "sleeping", "r-signal": "waiting-for-signal",
        "r-parent": "waiting-for-child", "r-parked": "parked", "r-done": "none",
        "r-due": "due", "r-no-worker": "no-worker",
    }


async def test_api_and_dashboard_agree_on_every_blocked_reason(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    expected = await _one_per_reason(store, pool)
    assert set(expected.values()) == set(REASONS), "every reason is exercised"
    assert set(views.BLOCKED_REASONS) == set(REASONS), "the dashboard knows every reason"
    # What the dashboard reads: the live workflows, and what each queue holds.
    live = await store.history.live_workflow_ids(60)
    assert live == set(LIVE_WORKFLOWS) | {carried("op-versioned", "v2")}

    rows, total = await store.dashboard.ui_list(live_workflows=live, limit=100)
    assert total == len(expected)
    listed = {r["execution_id"]: r for r in rows}
    for eid, reason in expected.items():
        api_answer = (await get_record(api, eid))["blockedBy"]
        api_reason = api_answer["reason"] if api_answer else "none"
        row = listed[eid]
        python = blocked_by(row, live)
        seen = {
            "api": api_reason,
            "dashboard filter SQL": row["blocked_reason"],
            "dashboard words": views.explain_blocked(python, row).reason,
        }
        assert seen == dict.fromkeys(seen, reason), (eid, seen)
        found, n = await store.dashboard.ui_list(live_workflows=live, blocked_by=reason)
        assert (n, [r["execution_id"] for r in found]) == (1, [eid]), reason

    # The queue reasons' details, from the counts the claim uses.
    assert (await get_record(api, "r-queue-paused"))["blockedBy"] == {
        "reason": "queue-paused", "queue": "q-paused"}
    assert (await get_record(api, "r-concurrency"))["blockedBy"] == {
        "reason": "concurrency-limit", "queue": "q-one", "running": 1, "limit": 1}
    rate = (await get_record(api, "r-rate"))["blockedBy"]
    started = await pool.fetchval("SELECT started_at FROM queue_starts WHERE queue = 'q-rate'")
    assert rate == {"reason": "rate-limited", "queue": "q-rate",
                    "until": rate["until"]}, rate
    assert datetime.fromisoformat(rate["until"]) == started + timedelta(hours=1)
    # The metrics count by the same rule.
    waiting = (await store.workers.metrics_snapshot())["waiting"]
    for reason in expected.values():
        if reason in ("queue-paused", "concurrency-limit", "rate-limited",
                      "no-worker-for-version"):
            assert sum(n for (r, _), n in waiting.items() if r == reason) == 1, (reason, waiting)

    # The version no live worker carries, and its workflow's.
    version = (await get_record(api, "r-version"))["blockedBy"]
    assert version == {"reason": "no-worker-for-version", "workflowId": "op-versioned",
                       "version": "v1", "since": version["since"]}, version
    page = await api.get("/ui/executions/r-version")
    assert page.status_code == 200, page.text
    assert "version “v1” of workflow “op-versioned”" in page.text
    listing = await api.get("/ui", params={"blockedBy": "no-worker-for-version"})
    assert listing.status_code == 200, listing.text
    assert "/ui/executions/r-version" in listing.text and "no worker with version" in listing.text

    # A delayed start says when it is first due (not "sleeping": no step waits).
    delayed = (await get_record(api, "r-delayed"))["blockedBy"]
    assert delayed == {"reason": "delayed-start", "until": delayed["until"]}, delayed
    admitted_at = await pool.fetchval(
        "SELECT admitted_at FROM executions WHERE execution_id = 'r-delayed'")
    assert datetime.fromisoformat(delayed["until"]) == admitted_at + timedelta(hours=1)

    # The parent waiting for its child is not "waiting for a free worker".
    assert (await get_record(api, "r-parent"))["blockedBy"] == {
        "reason": "waiting-for-child", "child": "r-parent~child"}
    page = await api.get("/ui/executions/r-parent")
    assert page.status_code == 200, page.text
    assert "free worker" not in page.text
    assert "r-parent~child" in page.text and "Waiting for the child execution" in page.text
    listing = await api.get("/ui", params={"blockedBy": "waiting-for-child"})
    assert listing.status_code == 200, listing.text
    assert "/ui/executions/r-parent" in listing.text
    assert "/ui/executions/r-signal" not in listing.text


# ------------------------------------------------- an expired lease, healed

REAPER_RULES = ["plain", "cancel", "deadline-passed", "deadline-before-redelivery", "poison",
                "cancel-and-poison"]


def _view(rec: dict) -> dict:
    """What must not change when the reaper writes what the read predicted."""
    keys = ("status", "outcome", "unacknowledged_deliveries", "parked_reason", "parked_step",
            "due_at", "last_unacknowledged_at", "lease_owner", "lease_expires_at")
    return {k: rec[k] for k in keys}


@pytest.mark.parametrize("rule", REAPER_RULES)
async def test_an_expired_lease_reads_as_the_reaper_will_leave_it(
        pool: asyncpg.Pool, rule: str) -> None:
    # A redelivery delay of 60 s, so a deadline 30 s away lies before the
    # next delivery could start: the reaper times that one out too.
    store = ExecutionStore(pool, redelivery_base_seconds=60, redelivery_cap_seconds=60)
    eid = f"heal-{rule}"
    await admit(store, "op-quick", eid, timeout_seconds=3600)
    lease = await _claim(store, "op-quick")
    await store.leases.acknowledge(lease, "suspended", waiting_on={"signal": "s"})
    await store.operator.request_wake(eid)
    lease = await _claim(store, "op-quick")  # a second delivery: ever suspended
    if rule in ("cancel", "cancel-and-poison"):
        assert (await store.operator.request_cancel(eid, "ops"))[0] == "requested"
    if rule in ("poison", "cancel-and-poison"):
        await pool.execute("UPDATE executions SET unacknowledged_deliveries = $2 "
                           "WHERE execution_id = $1", eid, store.config.max_unacknowledged - 1)
    if rule == "deadline-passed":
        await pool.execute("UPDATE executions SET deadline = now() - interval '1 second' "
                           "WHERE execution_id = $1", eid)
    if rule == "deadline-before-redelivery":
        await pool.execute("UPDATE executions SET deadline = now() + interval '30 seconds' "
                           "WHERE execution_id = $1", eid)
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)

    healed = await store.history.get(eid)
    [listed] = (await store.dashboard.ui_list(live_workflows={"op-quick"}))[0]
    counts = await store.dashboard.status_counts()
    gauges = await store.workers.metrics_snapshot()
    expected_status = {
        "plain": "suspended", "cancel": "cancelled", "deadline-passed": "timed_out",
        "deadline-before-redelivery": "timed_out", "poison": "parked",
        "cancel-and-poison": "cancelled",
    }[rule]
    assert healed["status"] == expected_status, healed
    assert _view(listed) == _view(healed)
    assert counts == {expected_status: 1}
    unfinished = expected_status in ("admitted", "running", "suspended", "parked")
    assert gauges["by_status"] == ({expected_status: 1} if unfinished else {}), gauges
    if rule != "plain":
        assert healed["lease_expired"] is True
        assert blocked_by(healed, {"op-quick"}) == (
            {"reason": "parked", "parkedReason": "poison", "step": None}
            if expected_status == "parked" else None)

    assert (await LeaseReaper(store).run_once()).expired == 1
    reaped = await store.history.get(eid)
    assert reaped["lease_expired"] is False
    assert _view(reaped) == _view(healed), (rule, healed, reaped)
    if rule != "plain":  # "plain" reads lease-expired until the reaper writes it
        assert blocked_by(reaped, {"op-quick"}) == blocked_by(healed, {"op-quick"})
    assert await store.dashboard.status_counts() == counts
    assert (await store.workers.metrics_snapshot())["by_status"] == gauges["by_status"]


async def test_an_unheld_record_past_its_cleanup_window_reads_timed_out_before_the_sweep(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "heal-sweep", timeout_seconds=3600)
    await store.leases.acknowledge(await _claim(store, "op-quick"), "suspended",
                            waiting_on={"signal": "s"})
    # Past the deadline but within the cleanup window (30 s): still waiting
    # for the delivery that raises DeadlineExceeded, due at once.
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 second', "
                       "due_at = now() - interval '1 second' WHERE execution_id = $1", eid)
    within = await get_record(api, eid)
    assert within["status"] == "suspended", within
    assert within["blockedBy"]["reason"] in ("due", "no-worker"), within
    # The window closed with no delivery: it reads timed_out before the sweep.
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 hour' "
                       "WHERE execution_id = $1", eid)
    healed = await get_record(api, eid)
    assert (healed["status"], healed["blockedBy"]) == ("timed_out", None), healed
    assert healed["outcome"]["error"]["name"] == "DeadlineExceeded"
    assert await store.dashboard.status_counts() == {"timed_out": 1}
    await LeaseReaper(store).run_once()
    swept = await get_record(api, eid)
    for key in ("status", "outcome", "dueAt", "blockedBy", "parked"):
        assert swept[key] == healed[key], key


# ------------------------------------ the SQL filter and Python, every case

async def test_reason_sql_and_python_agree_over_every_combination(pool: asyncpg.Pool) -> None:
    """app/blocked.py's RULES rendered to SQL (the dashboard's filter) and
    tested in Python (the API) give the same reason for every combination of
    the fields they read, NULLs included."""
    import itertools
    import json

    from app.blocked import Live, reason_of, reason_sql

    now = await pool.fetchval("SELECT now()")
    times = {"null": None, "past": now - timedelta(minutes=1), "future": now + timedelta(minutes=1)}
    statuses = ("admitted", "suspended", "running", "parked", "completed", "failed",
                "cancelled", "timed_out")
    waits = (None, {}, {"child": "c"}, {"signal": "s"}, {"sleep": "k"},
             {"child": "c", "signal": "s"})
    # Unknown, nobody, the workflow unversioned, at v1, and another workflow at v1.
    lives = (None, set(), {"wf"}, Live({"wf"}, versions=[("wf", "v1")]),
             Live({"other"}, versions=[("other", "v1")]))
    rows = [
        {"status": s, "lease_expired": x, "redeliver_after": times[ra], "due_at": times[d],
         "waiting_on": w, "workflow_id": "wf", "read_at": now, "token": t, "code_version": v}
        for s, x, ra, d, w, t, v in itertools.product(
            statuses, (None, False, True), times, times, waits, (0, 1), (None, "v1", "v2"))
    ]
    sql = reason_sql("r", "$2::text[]")
    counts: dict[str, int] = {}
    for live in lives:
        answers = await pool.fetch(
            f"""
            SELECT {sql} AS reason
            FROM jsonb_to_recordset($1::jsonb) AS r(
                status text, lease_expired boolean, redeliver_after timestamptz,
                due_at timestamptz, waiting_on jsonb, workflow_id text, read_at timestamptz,
                token bigint, code_version text, i int)
            ORDER BY r.i
            """,
            json.loads(json.dumps([{**row, "i": i} for i, row in enumerate(rows)],
                                  default=lambda t: t.isoformat())),
            None if live is None else sorted(live),
        )
        assert len(answers) == len(rows)
        for row, answer in zip(rows, answers, strict=True):
            python = reason_of(row, live)
            assert answer["reason"] == python, (row, live)
            counts[python] = counts.get(python, 0) + 1
    # Every rule was reached but the queue's (no queue state here: see below).
    assert set(counts) == set(REASONS) - {"queue-paused", "concurrency-limit",
                                          "rate-limited"}, counts


async def test_reads_use_the_stores_own_poison_threshold(pool: asyncpg.Pool) -> None:
    """The dashboard's listing heals with the store's threshold (here 3)."""
    store = ExecutionStore(pool, max_unacknowledged_deliveries=3)
    eid = await admit(store, "op-quick", "heal-threshold")
    await _claim(store, "op-quick")
    await pool.execute("UPDATE executions SET unacknowledged_deliveries = 2, "
                       "lease_expires_at = now() - interval '1 second' WHERE execution_id = $1",
                       eid)
    [listed] = (await store.dashboard.ui_list(live_workflows={"op-quick"}))[0]
    assert (listed["status"], listed["parked_reason"]) == ("parked", "poison")
    assert await store.dashboard.status_counts() == {"parked": 1}
    assert (await store.workers.metrics_snapshot())["parked"] == {"poison": 1}


async def test_get_and_list_use_the_stores_own_poison_threshold(pool: asyncpg.Pool) -> None:
    store = ExecutionStore(pool, max_unacknowledged_deliveries=3)
    eid = await admit(store, "op-quick", "heal-threshold-get")
    await _claim(store, "op-quick")
    await pool.execute("UPDATE executions SET unacknowledged_deliveries = 2, "
                       "lease_expires_at = now() - interval '1 second' WHERE execution_id = $1",
                       eid)
    got = await store.history.get(eid)
    [listed], _ = await store.history.list()
    assert (got["status"], listed["status"]) == ("parked", "parked")
    await LeaseReaper(store).run_once()
    assert (await store.history.get(eid))["status"] == "parked"


async def test_queue_rules_in_sql_and_python_agree_over_every_combination(
        pool: asyncpg.Pool) -> None:
    """The queue reasons (queue-paused, concurrency-limit, rate-limited) in
    SQL, over the queue_state / key_state rows, and in Python, over the
    QueueState they are read into, agree for every combination of what a
    queue holds, its settings, and the record (status, first start or not,
    with or without a key)."""
    import itertools
    import json

    from app.blocked import Live, queue_states, reason_of, reason_sql

    now = await pool.fetchval("SELECT now()")
    oldest = now - timedelta(seconds=10)
    queues, keys = [], []
    for i, (paused, conc, per_key, rate, per_key_rate, hold, q_run, q_starts, k_run,
            k_starts) in enumerate(itertools.product(
                (False, True), (None, 1), (None, 1), (None, 1), (False, True), (False, True),
                (0, 1), (0, 1), (0, 1), (0, 1))):
        name = f"q{i}"
        queues.append({
            "name": name, "paused": paused, "concurrency": conc, "per_key_concurrency": per_key,
            "rate_limit": rate, "rate_period": 60.0 if rate else None,
            "rate_per_key": per_key_rate, "hold_while_suspended": hold, "running": q_run,
            # As queue_state reads them: starts only for a rate limit per queue.
            "starts": q_starts if rate and not per_key_rate else None,
            "oldest_start": oldest if rate and not per_key_rate and q_starts else None})
        keys.append({"queue": name, "concurrency_key": "a", "running": k_run,
                     "starts": k_starts, "oldest_start": oldest if k_starts else None})
    rows = [
        {"status": s, "lease_expired": False, "redeliver_after": None,
         "due_at": now - timedelta(seconds=1), "waiting_on": None, "workflow_id": "wf",
         "read_at": now, "queue": q["name"], "concurrency_key": key, "token": token}
        for q in queues for s in ("admitted", "suspended", "completed")
        for key in (None, "a", "b") for token in (0, 1)
    ]
    live = Live({"wf"}, queue_states(queues, keys))
    answers = await pool.fetch(
        f"""
        SELECT {reason_sql("r", "$4::text[]", "q", "k")} AS reason
        FROM jsonb_to_recordset($1::jsonb) AS r(
            status text, lease_expired boolean, redeliver_after timestamptz,
            due_at timestamptz, waiting_on jsonb, workflow_id text, read_at timestamptz,
            queue text, concurrency_key text, token bigint, code_version text, i int)
        LEFT JOIN jsonb_to_recordset($2::jsonb) AS q(
            name text, paused boolean, concurrency int, per_key_concurrency int,
            rate_limit int, rate_period float8, rate_per_key boolean,
            hold_while_suspended boolean, running int, starts int, oldest_start timestamptz)
            ON q.name = r.queue
        LEFT JOIN jsonb_to_recordset($3::jsonb) AS k(
            queue text, concurrency_key text, running int, starts int,
            oldest_start timestamptz)
            ON k.queue = r.queue AND k.concurrency_key = r.concurrency_key
        ORDER BY r.i
        """,
        *(json.loads(json.dumps(x, default=lambda t: t.isoformat()))
          for x in ([{**row, "i": i} for i, row in enumerate(rows)], queues, keys)),
        ["wf"],
    )
    assert len(answers) == len(rows)
    counts: dict[str, int] = {}
    for row, answer in zip(rows, answers, strict=True):
        python = reason_of(row, live)
        assert answer["reason"] == python, row
        counts[python] = counts.get(python, 0) + 1
    assert set(counts) == {"none", "queue-paused", "concurrency-limit", "rate-limited", "due"}
