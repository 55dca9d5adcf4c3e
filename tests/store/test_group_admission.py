"""Issue 18, item 2: concurrent admissions in one process are admitted by one
statement per batch (group commit), and each caller still gets the answer
admission gives alone: Admitted, Conflict or Existing, with the same rows
and events. Whatever a batch does not admit (an ID taken before or by another
request of the same batch, a retired ID, a value Postgres cannot store) is
answered by the single statement, alone.

Real Postgres, real concurrency: callers are concurrent tasks on the store's
pool. A spy around the batch flush records which requests went together, so
each test shows the batch it meant to form was formed."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from app.store import Admitted, Conflict, ExecutionStore, Existing, InvalidEvent
from app.store.group_commit import GroupCommit
from tests.support.races import StatementGate
from tests.support.waiting import wait_until


async def retire(store: ExecutionStore, pool: asyncpg.Pool, execution_id: str) -> None:
    """Admit, run to completion, and prune: the ID is retired."""
    assert await store.admissions.admit(workflow_id="ret-wf", params={},
                                        execution_id=execution_id) == \
        Admitted(execution_id, "admitted")
    [d] = await store.leases.claim_due(1, 30.0, "w", ["ret-wf"])
    await store.leases.acknowledge(d.lease, "completed", result={"ok": True})
    await pool.execute("UPDATE executions SET updated_at = now() - interval '30 days' "
                       "WHERE execution_id = $1", execution_id)
    assert await store.history.prune_terminal(14 * 86400, 100) == 1


def spy_batches(store: ExecutionStore) -> list[list[str]]:
    """The execution IDs of each batch the store's admissions flush, in
    order (the flush itself is the real one)."""
    admissions = store.admissions
    seen: list[list[str]] = []
    real = admissions._admit_batch

    async def flush(requests):
        seen.append([r.execution_id for r in requests])
        return await real(requests)

    admissions.group = GroupCommit(flush)
    return seen


async def admit_all(store: ExecutionStore, calls: list[dict[str, Any]]) -> list[Any]:
    """Every call at once, each in its own task; each one's answer or error."""
    return await asyncio.gather(
        *(store.admissions.admit(**call) for call in calls), return_exceptions=True)


def varied_call(i: int, execution_id: str) -> dict[str, Any]:
    """An admission using the columns admission computes or copies."""
    call: dict[str, Any] = {
        "workflow_id": f"ga-wf-{i % 3}", "execution_id": execution_id,
        "params": [None, {"n": i}, [i, "x"], "s", i, 1.5][i % 6],
        "request_id": f"req-{i}" if i % 2 else None, "priority": i % 4,
    }
    if i % 5 == 0:
        call["context"] = {"c": i}
    if i % 4 == 1:
        call["timeout_seconds"] = 30.0 + i
    elif i % 4 == 2:
        call["deadline"] = datetime(2100, 1, 1, tzinfo=UTC) + timedelta(seconds=i)
    if i % 3 == 1:
        call["delay_seconds"] = float(i)
    elif i % 7 == 2:
        call["start_at"] = datetime(2099, 1, 1, tzinfo=UTC) + timedelta(minutes=i)
    elif i % 7 == 3:
        call["start_at"] = datetime(2000, 1, 1, tzinfo=UTC)  # in the past: due now
    if i % 6 == 0:
        call.update(code_version="v2", admitted_by="tok-1", traceparent=f"00-{i:032x}-{i:016x}-01")
    call["queue"] = "default" if i % 8 else f"ga-queue-{i % 16}"
    if i % 9 == 0:
        call["concurrency_key"] = f"k{i}"
    return call


async def projection(pool: asyncpg.Pool, prefix: str) -> dict[str, tuple]:
    """What admission wrote for the IDs starting with `prefix`, keyed by the
    rest of the ID; times relative to the admission's own now()."""
    rows = await pool.fetch(
        """
        SELECT substr(e.execution_id, length($1) + 1) AS key, e.workflow_id, e.params::text,
               e.context::text, e.status, e.code_version, e.admitted_by, e.traceparent,
               e.queue, e.concurrency_key, e.priority, e.token,
               CASE WHEN e.due_at > e.admitted_at + interval '1 day' THEN e.due_at::text
                    ELSE round(extract(epoch FROM e.due_at - e.admitted_at)::numeric, 3)::text
               END AS due,
               CASE WHEN e.deadline > e.admitted_at + interval '1 day' THEN e.deadline::text
                    ELSE round(extract(epoch FROM e.deadline - e.admitted_at)::numeric, 3)::text
               END AS deadline,
               (SELECT array_agg(v.kind || ' ' || v.detail::text ORDER BY v.event_id)
                FROM execution_events v WHERE v.execution_id = e.execution_id) AS events,
               EXISTS (SELECT 1 FROM queues q WHERE q.name = e.queue) AS queue_known
        FROM executions e WHERE starts_with(e.execution_id, $1)
        """,
        prefix)
    return {r["key"]: tuple(r)[1:] for r in rows}


async def test_fifty_concurrent_admissions_write_what_fifty_single_ones_write(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    batches = spy_batches(store)
    calls = [varied_call(i, f"ga-b-{i}") for i in range(50)]
    answers = await admit_all(store, calls)
    assert answers == [Admitted(f"ga-b-{i}", "admitted") for i in range(50)]
    # Idle: the first two flushed at once, alone; the rest waited and went together.
    assert store.admissions.group is not None
    assert store.admissions.group.requests == 50
    assert store.admissions.group.batches == len(batches) < 50
    assert max(len(b) for b in batches) >= 40, batches
    assert sorted(i for b in batches for i in b) == sorted(c["execution_id"] for c in calls)

    # The same admissions one at a time, each its own statement (a caller's
    # transaction never batches).
    async with store.transaction() as tx:
        assert tx.admissions.group is None
        for i in range(50):
            assert await tx.admissions.admit(**varied_call(i, f"ga-s-{i}")) == \
                Admitted(f"ga-s-{i}", "admitted")
    batched, single = await projection(pool, "ga-b-"), await projection(pool, "ga-s-")
    assert len(batched) == 50
    assert batched == single
    for key, row in batched.items():
        i = int(key)
        request = f'"requestId": "req-{i}", ' if i % 2 else ""
        assert row[-2] == ["admitted {" + request + f'"workflowId": "ga-wf-{i % 3}"}}'], row
        assert row[-1] is True  # its queue exists


async def test_the_same_id_twice_in_one_batch_is_admitted_once(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    batches = spy_batches(store)
    calls: list[dict[str, Any]] = [{"workflow_id": "ga-wf", "params": {"n": i},
              "execution_id": "ga-dup" if i % 3 == 2 else f"ga-{i}"} for i in range(30)]
    answers = await admit_all(store, calls)
    dup_batch = max(batches, key=lambda b: b.count("ga-dup"))
    assert dup_batch.count("ga-dup") >= 5, batches  # together, in one statement
    dup_answers = [a for c, a in zip(calls, answers, strict=True) if c["execution_id"] == "ga-dup"]
    assert dup_answers.count(Admitted("ga-dup", "admitted")) == 1, dup_answers
    assert [a for a in dup_answers if not isinstance(a, Admitted)] == \
        [Conflict("ga-dup", "admitted", "ga-wf")] * 9
    for c, a in zip(calls, answers, strict=True):
        if c["execution_id"] != "ga-dup":
            assert a == Admitted(c["execution_id"], "admitted")
    assert await pool.fetchval("SELECT count(*) FROM executions WHERE execution_id = 'ga-dup'") == 1
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = 'ga-dup'") == 1


async def test_ids_repeated_within_and_across_concurrent_batches_are_admitted_once_each(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    """Callers arriving at random moments, IDs drawn from a few: each ID is
    admitted exactly once and every other caller for it gets Conflict. Run
    until both were seen: an ID twice in one batch, and an ID in two batches."""
    within = across = False
    for rnd in range(20):
        batches = spy_batches(store)
        ids = [f"ga-r{rnd}-{n}" for n in range(6)]
        rng = random.Random(rnd)

        async def caller(i: int, eid: str, delay: float) -> Any:
            await asyncio.sleep(delay)
            return await store.admissions.admit(workflow_id="ga-wf", params={"i": i},
                                                execution_id=eid)

        chosen = [rng.choice(ids) for _ in range(40)]
        answers = await asyncio.gather(*(caller(i, eid, rng.uniform(0, 0.05))
                                         for i, eid in enumerate(chosen)))
        for eid in set(chosen):
            mine = [a for c, a in zip(chosen, answers, strict=True) if c == eid]
            assert mine.count(Admitted(eid, "admitted")) == 1, (eid, mine)
            assert all(a == Conflict(eid, "admitted", "ga-wf") for a in mine
                       if not isinstance(a, Admitted)), (eid, mine)
        assert await pool.fetchval(
            "SELECT count(*) FROM executions WHERE execution_id = ANY($1::text[])", ids) == \
            len(set(chosen))
        assert await pool.fetchval(
            "SELECT count(*) FROM execution_events WHERE execution_id = ANY($1::text[])",
            ids) == len(set(chosen))
        within |= any(n > 1 for b in batches for n in Counter(b).values())
        across |= any(sum(eid in b for b in batches) > 1 for eid in ids)
        if within and across:
            break
    assert within and across, (within, across)


async def test_a_batch_refuses_taken_and_retired_ids_and_returns_equal_admissions(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    assert await store.admissions.admit(workflow_id="ga-wf", params={"a": 1},
                                        execution_id="ga-old") == Admitted("ga-old", "admitted")
    await retire(store, pool, "ga-ret")
    batches = spy_batches(store)
    calls: list[dict[str, Any]] = [
        {"workflow_id": "ga-wf", "params": {"n": i}, "execution_id": f"ga-new-{i}"}
        for i in range(6)]
    calls += [
        {"workflow_id": "ga-wf", "params": {"a": 1}, "execution_id": "ga-old"},
        {"workflow_id": "ga-wf", "params": {"a": 1}, "execution_id": "ga-old",
         "if_exists": "return"},
        {"workflow_id": "ga-wf", "params": {"a": 2}, "execution_id": "ga-old",
         "if_exists": "return"},
        {"workflow_id": "ga-other", "params": {"a": 1}, "execution_id": "ga-old",
         "if_exists": "return"},
        {"workflow_id": "ret-wf", "params": {}, "execution_id": "ga-ret"},
        {"workflow_id": "ret-wf", "params": {}, "execution_id": "ga-ret", "if_exists": "return"},
    ]
    answers = await admit_all(store, calls)
    assert answers == [Admitted(f"ga-new-{i}", "admitted") for i in range(6)] + [
        Conflict("ga-old", "admitted", "ga-wf"),
        Existing("ga-old", "admitted"),
        Conflict("ga-old", "admitted", "ga-wf"),
        Conflict("ga-old", "admitted", "ga-wf"),
        Conflict("ga-ret", "retired", "ret-wf"),
        Conflict("ga-ret", "retired", "ret-wf"),
    ]
    assert max(len(b) for b in batches) >= 8, batches
    assert any({"ga-old", "ga-ret"} <= set(b) for b in batches), batches
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id IN ('ga-old', 'ga-ret') "
        "AND kind = 'admitted'") == 1  # ga-old's own; ga-ret's went with its execution
    assert await store.history.get("ga-ret") is None


async def test_an_id_held_by_another_batch_still_in_flight_is_a_conflict(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    """Forced: the first batch has inserted the ID but cannot commit (a gate
    holds it at its 'admitted' event); a second batch with the same ID waits
    for it, inserts nothing, and its caller is answered alone: Conflict,
    once the first has committed."""
    batches = spy_batches(store)
    async with StatementGate(pool, "execution_events",
                             "NEW.kind = 'admitted' AND NEW.execution_id = 'ga-inflight'") as gate:
        first = asyncio.create_task(store.admissions.admit(
            workflow_id="ga-wf", params={}, execution_id="ga-inflight"))
        await gate.until_held()

        async def waiting_for_the_first() -> bool:
            return await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'transactionid'") >= 1

        second = asyncio.create_task(store.admissions.admit(
            workflow_id="ga-wf", params={}, execution_id="ga-inflight"))
        await wait_until(waiting_for_the_first, timeout=10, interval=0.01,
                         what="the second batch waiting for the first")
        assert batches == [["ga-inflight"], ["ga-inflight"]]  # two statements in flight
        await gate.open()
    assert await first == Admitted("ga-inflight", "admitted")
    assert await second == Conflict("ga-inflight", "admitted", "ga-wf")
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = 'ga-inflight'") == 1


@pytest.mark.parametrize("bad", [
    {"params": {"x": float("nan")}},  # refused by the encoder, before sending
    {"params": {"s": "a\u0000b"}},  # refused by jsonb, in Postgres
    {"context": {"k": "\ud800"}},  # a lone surrogate: not UTF-8
    {"execution_id": "ga-nul\u0000"},  # refused by text, in Postgres
    {"request_id": "r\u0000"},
], ids=["nan", "nul-in-params", "surrogate-in-context", "nul-in-id", "nul-in-request-id"])
async def test_an_unstorable_value_fails_only_its_own_admission(
        store: ExecutionStore, pool: asyncpg.Pool, bad: dict[str, Any]) -> None:
    batches = spy_batches(store)
    calls: list[dict[str, Any]] = [
        {"workflow_id": "ga-wf", "params": {"n": i}, "execution_id": f"ga-ok-{i}"}
        for i in range(12)]
    calls[7] = {**calls[7], **bad}
    answers = await admit_all(store, calls)
    assert isinstance(answers[7], InvalidEvent), answers[7]
    for i, answer in enumerate(answers):
        if i != 7:
            assert answer == Admitted(f"ga-ok-{i}", "admitted"), (i, answer)
    assert any(len(b) > 5 and calls[7]["execution_id"] in b for b in batches), batches
    assert await pool.fetchval("SELECT count(*) FROM executions") == 11
    assert await pool.fetchval("SELECT count(*) FROM execution_events") == 11


async def test_admission_in_a_callers_transaction_joins_it(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    with pytest.raises(RuntimeError, match="roll back"):
        async with store.transaction() as tx:
            assert await tx.admissions.admit(workflow_id="ga-wf", params={},
                                             execution_id="ga-tx") == Admitted("ga-tx", "admitted")
            raise RuntimeError("roll back")
    assert await pool.fetchval("SELECT count(*) FROM executions") == 0
    assert await pool.fetchval("SELECT count(*) FROM execution_events") == 0


async def test_any_error_of_one_requests_own_fails_only_that_request(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    """A workflow ID too long for its index fails the batch's statement
    (program limit, not a data error): each request is then admitted alone,
    and only that one gets the error it gets alone."""
    rng = random.Random(18)
    long_id = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12000))
    async with store.transaction() as tx:
        with pytest.raises(asyncpg.ProgramLimitExceededError) as alone:
            await tx.admissions.admit(workflow_id=long_id, params={}, execution_id="ga-long")
    batches = spy_batches(store)
    calls: list[dict[str, Any]] = [
        {"workflow_id": "ga-wf", "params": {"n": i}, "execution_id": f"ga-ok-{i}"}
        for i in range(12)]
    calls[7] = {**calls[7], "workflow_id": long_id}
    answers = await admit_all(store, calls)
    assert type(answers[7]) is type(alone.value), answers[7]
    assert [a for i, a in enumerate(answers) if i != 7] == \
        [Admitted(f"ga-ok-{i}", "admitted") for i in range(12) if i != 7]
    assert any(len(b) > 5 and "ga-ok-7" in b for b in batches), batches
    assert await pool.fetchval("SELECT count(*) FROM executions") == 11
