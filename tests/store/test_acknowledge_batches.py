"""Acknowledgements by group commit, against real Postgres.

On the pool, acknowledgements that arrive while earlier ones are in flight
go together in one statement (`store.leases.acknowledgements`, a
GroupCommit). Every row keeps its own fence and its own outcome rules, and
each caller gets its own answer. Batches are formed deterministically: the
first two acknowledgements (as many as GroupCommit keeps in flight) are held
mid-statement by a StatementGate (at their 'acknowledged' event, their rows
locked), every acknowledgement sent meanwhile waits for the next statement,
and the gate is then opened.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from app.store import Acknowledged, Delivery, ExecutionStore, InvalidEvent, LeaseLost
from app.store.leases import SEND_ALONE, _Ack
from tests.support.admission import admitting
from tests.support.claims import claim, claim_one
from tests.support.races import StatementGate
from tests.support.waiting import wait_until

WORKFLOW = "ack-batch"
admit = admitting(WORKFLOW, params={})


async def held(store: ExecutionStore, n: int, prefix: str) -> dict[str, Delivery]:
    """`n` executions admitted and claimed, by ID."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    for eid in ids:
        await admit(store, eid)
    claimed = await claim(store)
    assert sorted(claimed) == sorted(ids)
    return claimed


def acknowledging(pool: asyncpg.Pool, blockers: list[Delivery]) -> StatementGate:
    """A gate that holds the statements acknowledging `blockers` mid-flight,
    at their 'acknowledged' event (their execution rows locked)."""
    ids = ", ".join(f"'{d.lease.execution_id}'" for d in blockers)
    return StatementGate(pool, "execution_events",
                         f"NEW.kind = 'acknowledged' AND NEW.execution_id IN ({ids})")


async def in_one_batch(store: ExecutionStore, pool: asyncpg.Pool, blockers: list[Delivery],
                       sends: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Acknowledge `blockers` (completed), each held mid-statement by a gate,
    so that both flushes GroupCommit keeps in flight wait; run `sends`
    meanwhile (all waiting for the next statement); open the gate. Returns
    the answers of `sends` (an exception is an answer), after checking that
    they went in one statement together."""
    group = store.leases.acknowledgements
    assert group is not None  # the store is on the pool
    assert len(blockers) == 2
    before = (group.batches, group.requests)
    async with acknowledging(pool, blockers) as gate:
        first = [asyncio.ensure_future(store.leases.acknowledge(d.lease, "completed"))
                 for d in blockers]
        await gate.until_held(2)
        await wait_until(lambda: group.batches == before[0] + 2, timeout=10,
                         what="both blockers' statements in flight")
        rest = [asyncio.ensure_future(send()) for send in sends]
        for _ in range(5):
            await asyncio.sleep(0)  # each has submitted its request
        assert group.batches == before[0] + 2  # nothing more sent while both wait
        await gate.open()
        answers = await asyncio.gather(*rest, return_exceptions=True)
        assert all(isinstance(a, Acknowledged) for a in await asyncio.gather(*first))
    # Two lone statements, then one with every request sent meanwhile.
    assert (group.batches - before[0], group.requests - before[1]) == (3, 2 + len(sends))
    return list(answers)


async def events(pool: asyncpg.Pool, execution_id: str) -> list[str]:
    return [r["kind"] for r in await pool.fetch(
        "SELECT kind FROM execution_events WHERE execution_id = $1 ORDER BY event_id",
        execution_id)]


async def test_a_stale_acknowledgement_in_a_batch_is_lease_lost_while_the_rest_commit(
        store, pool, clock):
    claimed = await held(store, 6, "stale")
    blockers = [claimed.pop("stale-0"), claimed.pop("stale-1")]
    # stale-2's lease expired and another worker holds it now.
    old = claimed["stale-2"]
    await clock.expire_lease("stale-2")
    new = await claim_one(store, "stale-2", owner="worker-B")
    assert new.lease.token == old.lease.token + 1
    order = sorted(claimed)

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(d.lease, "completed",
                                                         result={"eid": d.lease.execution_id}))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    assert isinstance(by_id.pop("stale-2"), LeaseLost)
    for eid, answer in by_id.items():
        assert answer == Acknowledged("completed", {"result": {"eid": eid}}), (eid, answer)
        rec = await pool.fetchrow("SELECT status, outcome, token FROM executions "
                                  "WHERE execution_id = $1", eid)
        assert (rec["status"], rec["outcome"]) == ("completed", {"result": {"eid": eid}})
        assert (await events(pool, eid))[-1] == "acknowledged"
    # The stale row changed nothing: still the new holder's, running; the
    # refusal is recorded with the stale token.
    rec = await pool.fetchrow("SELECT status, token, lease_owner FROM executions "
                              "WHERE execution_id = 'stale-2'")
    assert (rec["status"], rec["token"], rec["lease_owner"]) == (
        "running", new.lease.token, "worker-B")
    rejected = await pool.fetch("SELECT token FROM execution_events WHERE execution_id = "
                                "'stale-2' AND kind = 'fenced_write_rejected'")
    assert [r["token"] for r in rejected] == [old.lease.token]
    assert "acknowledged" not in await events(pool, "stale-2")


async def test_a_cancel_requested_on_one_row_of_a_batch_cancels_that_row_only(store, pool):
    claimed = await held(store, 5, "cancel")
    blockers = [claimed.pop("cancel-0"), claimed.pop("cancel-1")]
    answer, _ = await store.operator.request_cancel("cancel-3", by="alice")
    order = sorted(claimed)

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(d.lease, "completed", result=1))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    cancelled = by_id.pop("cancel-3")
    assert isinstance(cancelled, Acknowledged) and cancelled.status == "cancelled", cancelled
    assert cancelled.outcome is not None and cancelled.outcome["error"]["name"] == "Cancelled"
    assert (await events(pool, "cancel-3"))[-2:] == ["acknowledged", "cancelled"]
    for eid, got in by_id.items():
        assert got == Acknowledged("completed", {"result": 1}), (eid, got)
        assert (await events(pool, eid))[-1] == "acknowledged"


async def test_an_unstorable_result_in_a_batch_fails_only_its_own_acknowledgement(
        store, pool):
    claimed = await held(store, 5, "bad")
    blockers = [claimed.pop("bad-0"), claimed.pop("bad-1")]
    order = sorted(claimed)
    # "\u0000" is valid JSON that jsonb refuses: the statement fails in Postgres.
    results = {"bad-2": "fine", "bad-3": "nul \u0000 inside", "bad-4": [1, 2]}

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(
            d.lease, "completed", result=results[d.lease.execution_id]))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    assert isinstance(by_id.pop("bad-3"), InvalidEvent)
    assert (await pool.fetchval("SELECT status FROM executions WHERE execution_id = 'bad-3'")
            == "running")
    for eid, got in by_id.items():
        assert got == Acknowledged("completed", {"result": results[eid]}), (eid, got)


async def test_a_child_and_its_waiting_parent_acknowledged_together_leave_the_parent_due(
        store, pool):
    # The child's end wakes its parent; the parent is written after it, alone
    # (one statement never writes a row twice), so the wake is not lost.
    blockers = await held(store, 2, "block")
    await admit(store, "parent")
    parent = await claim_one(store, "parent")
    await store.compose.start_child(parent.lease, "kid", workflow_id=WORKFLOW, params={},
                                    child_id="child")
    child = await claim_one(store, "child")

    answers = await in_one_batch(store, pool, list(blockers.values()), [
        lambda: store.leases.acknowledge(child.lease, "completed", result="done"),
        lambda: store.leases.acknowledge(parent.lease, "suspended",
                                         waiting_on={"child": "child"}),
    ])

    assert answers[0] == Acknowledged("completed", {"result": "done"})
    assert answers[1] == Acknowledged("suspended", None)
    rec = await pool.fetchrow("SELECT status, due_at <= now() AS due, waiting_on FROM "
                              "executions WHERE execution_id = 'parent'")
    assert (rec["status"], rec["due"], rec["waiting_on"]) == (
        "suspended", True, {"child": "child"})


@pytest.mark.parametrize("in_transaction", [False, True])
async def test_a_lone_acknowledgement_is_a_batch_of_one(store, pool, in_transaction):
    # Idle, on the pool: sent at once, alone. In a caller's transaction: no
    # group at all, the statement joins the transaction.
    claimed = await held(store, 1, "lone")
    lease = claimed["lone-0"].lease
    group = store.leases.acknowledgements
    before = (group.batches, group.requests)
    if in_transaction:
        async with store.transaction() as tx:
            assert tx.leases.acknowledgements is None
            got = await tx.leases.acknowledge(lease, "failed", error={"name": "E",
                                                                      "message": "m"})
        assert (group.batches, group.requests) == before
    else:
        got = await store.leases.acknowledge(lease, "failed", error={"name": "E",
                                                                     "message": "m"})
        assert (group.batches - before[0], group.requests - before[1]) == (1, 1)
    assert got == Acknowledged("failed", {"error": {"name": "E", "message": "m"}})
    # Again with the same token: the recorded outcome, not a rejection.
    again = await store.leases.acknowledge(lease, "completed", result=2)
    assert again == got


async def test_lone_acknowledgements_of_held_rows_do_not_stall_an_unrelated_one(store, pool):
    # An idle worker flushes each acknowledgement alone. Two of them meeting
    # rows another transaction holds must not occupy both flushes the group
    # keeps in flight: they wait for their rows outside it, so stall-2 (a row
    # nobody holds) is answered while stall-0 and stall-1 are still held.
    claimed = await held(store, 3, "stall")
    group = store.leases.acknowledgements
    assert group is not None
    before = (group.batches, store.leases.sent_alone)
    async with row_locks(pool, ["stall-0", "stall-1"]):
        blocked = [asyncio.ensure_future(store.leases.acknowledge(claimed[e].lease, "completed"))
                   for e in ("stall-0", "stall-1")]
        await wait_until(lambda: group.batches == before[0] + 2, timeout=10,
                         what="both held rows' acknowledgements flushed")
        free = store.leases.acknowledge(claimed["stall-2"].lease, "completed")
        try:
            # Liveness, not speed: statement_timeout is 10 s.
            got = await asyncio.wait_for(free, 5)
        except TimeoutError:
            raise AssertionError(
                "stall-2 (a row nobody holds) not acknowledged in 5 s: "
                f"batches={group.batches - before[0]}, in flight={group._in_flight}") from None
        assert got == Acknowledged("completed", {"result": None})
        # The held rows' acknowledgements were sent back, and wait alone.
        assert store.leases.sent_alone - before[1] == 2
        assert not any(b.done() for b in blocked)
        for eid in ("stall-0", "stall-1"):
            assert await pool.fetchval("SELECT status FROM executions WHERE execution_id = $1",
                                       eid) == "running"
    assert await asyncio.gather(*blocked) == [Acknowledged("completed", {"result": None})] * 2
    assert group.batches - before[0] == 3


LOCK = "SELECT 1 FROM executions WHERE execution_id = ANY($1::text[]) FOR UPDATE"
# Another worker's claim taking the executions over (their leases expired).
TAKEOVER = ("UPDATE executions SET token = token + 1, lease_owner = 'worker-B' "
            "WHERE execution_id = ANY($1::text[])")


@contextlib.asynccontextmanager
async def row_locks(pool: asyncpg.Pool, ids: list[str], statement: str = LOCK,
                    commit: bool = False) -> AsyncIterator[None]:
    """Another transaction holds these execution rows (an operator's cancel
    of a tree, a bulk update; `statement`) until the block ends, and then
    rolls back (or commits)."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(statement, ids)
            yield
        except BaseException:
            await tx.rollback()
            raise
        if commit:
            await tx.commit()
        else:
            await tx.rollback()


async def batch_while_held(store: ExecutionStore, pool: asyncpg.Pool,
                           blockers: list[Delivery], acks: list[Delivery],
                           held: list[str], stalled: list[str], takeover: bool = False,
                           ) -> tuple[dict[str, Acknowledged],
                                      dict[str, asyncio.Future[Acknowledged]]]:
    """Acknowledge `acks` (completed, result = the ID) in ONE statement while
    another transaction holds the rows `held` (with `takeover`, a claim of
    them by another worker, then committed); `stalled` are the
    acknowledgements that lock stops. Checks that every other one was
    answered and committed while the rows were still held, and that the
    stalled ones wrote nothing yet. Returns the answers that came, and the
    acknowledgements still waiting (the lock is released when this returns)."""
    group = store.leases.acknowledgements
    assert group is not None
    before = group.batches
    async with row_locks(pool, held, TAKEOVER if takeover else LOCK, commit=takeover):
        async with acknowledging(pool, blockers) as gate:
            first = [asyncio.ensure_future(store.leases.acknowledge(d.lease, "completed"))
                     for d in blockers]
            await gate.until_held(2)
            await wait_until(lambda: group.batches == before + 2, timeout=10,
                             what="both blockers' statements in flight")
            sent = {d.lease.execution_id: asyncio.ensure_future(store.leases.acknowledge(
                d.lease, "completed", result=d.lease.execution_id)) for d in acks}
            for _ in range(5):
                await asyncio.sleep(0)
            assert group.batches == before + 2
            await gate.open()
            assert all(isinstance(a, Acknowledged) for a in await asyncio.gather(*first))
        free = [eid for eid in sent if eid not in stalled]
        # Liveness, not speed: the rows nobody else holds are answered while
        # the others' lock is still held (statement_timeout is 10 s).
        await wait_until(lambda: all(sent[eid].done() for eid in free), timeout=8,
                         what="the batch's free rows answered while another row is held")
        answered = {eid: f.result() for eid, f in sent.items() if f.done()}
        for eid in free:
            rec = await pool.fetchrow("SELECT status, outcome FROM executions "
                                      "WHERE execution_id = $1", eid)
            assert rec is not None
            assert (rec["status"], rec["outcome"]) == ("completed", {"result": eid}), eid
        waiting: dict[str, asyncio.Future[Acknowledged]] = {
            eid: f for eid, f in sent.items() if not f.done()}
        assert sorted(waiting) == sorted(stalled)
        for eid in waiting:
            assert await pool.fetchval("SELECT status FROM executions WHERE execution_id = $1",
                                       eid) == "running"
    assert group.batches == before + 3  # the acks went together
    return answered, waiting


async def test_a_row_another_transaction_holds_waits_alone_while_the_rest_of_its_batch_commits(
        store, pool):
    claimed = await held(store, 5, "held")
    blockers = [claimed.pop("held-0"), claimed.pop("held-1")]
    answered, waiting = await batch_while_held(
        store, pool, blockers, [claimed[e] for e in sorted(claimed)], held=["held-3"],
        stalled=["held-3"])
    assert answered == {eid: Acknowledged("completed", {"result": eid})
                        for eid in ("held-2", "held-4")}
    assert sorted(waiting) == ["held-3"]
    # Released: the held row's acknowledgement completes on its own.
    assert await waiting["held-3"] == Acknowledged("completed", {"result": "held-3"})
    assert (await events(pool, "held-3"))[-1] == "acknowledged"


async def test_a_child_whose_parent_another_transaction_holds_waits_alone_and_wakes_it(
        store, pool):
    # The child's end wakes its parent: a held parent row would stop the
    # whole statement at the wake, so the child goes alone and waits.
    claimed = await held(store, 3, "tree")
    blockers = [claimed.pop("tree-0"), claimed.pop("tree-1")]
    await admit(store, "root")
    root = await claim_one(store, "root")
    await store.compose.start_child(root.lease, "kid", workflow_id=WORKFLOW, params={},
                                    child_id="leaf")
    assert await store.leases.acknowledge(root.lease, "suspended",
                                          waiting_on={"child": "leaf"}) == Acknowledged(
        "suspended", None)
    leaf = await claim_one(store, "leaf")
    await pool.execute("UPDATE executions SET due_at = now() + interval '1 hour' "
                       "WHERE execution_id = 'root'")

    answered, waiting = await batch_while_held(
        store, pool, blockers, [claimed["tree-2"], leaf], held=["root"], stalled=["leaf"])

    assert answered == {"tree-2": Acknowledged("completed", {"result": "tree-2"})}
    assert await waiting["leaf"] == Acknowledged("completed", {"result": "leaf"})
    rec = await pool.fetchrow("SELECT status, due_at <= now() AS due FROM executions "
                              "WHERE execution_id = 'root'")
    assert (rec["status"], rec["due"]) == ("suspended", True)


async def test_two_batches_whose_rows_wake_each_others_parents_do_not_deadlock(store, pool):
    # Batch X acknowledges P2 and c1 (a child of P1), batch Y P1 and c3 (a
    # child of P2): had each locked its own rows and then the parents its
    # children wake, X would wait for P1 (Y's) and Y for P2 (X's). Forced:
    # a test trigger makes each ending row's update take 0.4 s, so both
    # statements are in flight together.
    for eid in ("P1", "P2", "c1", "c3"):
        await admit(store, eid)
    await pool.execute("UPDATE executions SET parent_execution_id = 'P1' WHERE execution_id = 'c1'")
    await pool.execute("UPDATE executions SET parent_execution_id = 'P2' WHERE execution_id = 'c3'")
    ds = await claim(store)
    await pool.execute("""
        CREATE FUNCTION slow_end() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF OLD.status = 'running' AND NEW.status <> 'running' THEN PERFORM pg_sleep(0.4); END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER slow_end BEFORE UPDATE ON executions
            FOR EACH ROW EXECUTE FUNCTION slow_end();
    """)
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    deadlocks_before = await pool.fetchval(deadlocks)
    retried_before = store.pool.retried["40P01"], store.pool.exhausted["40P01"]
    alone_before = store.leases.sent_alone

    x, y = await asyncio.gather(
        each_answer(store, [ds["P2"], ds["c1"]]), each_answer(store, [ds["P1"], ds["c3"]]))

    assert x + y == [Acknowledged("completed", {"result": eid})
                     for eid in ("P2", "c1", "P1", "c3")]
    assert (store.pool.retried["40P01"], store.pool.exhausted["40P01"]) == retried_before
    # The statements met (one found a row or parent the other held, and sent
    # those acknowledgements alone, after it), and no statement deadlocked.
    assert store.leases.sent_alone > alone_before
    await pool.execute("SELECT pg_stat_force_next_flush()")
    assert await pool.fetchval(deadlocks) == deadlocks_before


async def each_answer(store: ExecutionStore, acks: list[Delivery]) -> list[Any]:
    """`acks` (completed, result = the ID) as one batch of the group commit
    (its flush called directly), each sent alone when the batch says so."""
    batch = [_Ack(d.lease, "completed", f'{{"result": "{d.lease.execution_id}"}}', None, None)
             for d in acks]
    answers = await store.leases._flush_acknowledgements(batch)
    return [await store.leases._acknowledge_alone(ack) if answer is SEND_ALONE else answer
            for ack, answer in zip(batch, answers, strict=True)]


async def test_an_error_of_one_row_that_is_not_the_database_failing_fails_only_its_own(
        store, pool):
    # A constraint one row breaks (here a test trigger's check_violation on
    # its event) fails the batch's statement: each is then sent alone.
    claimed = await held(store, 5, "check")
    blockers = [claimed.pop("check-0"), claimed.pop("check-1")]
    await pool.execute("""
        CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.execution_id = 'check-3' AND NEW.kind = 'acknowledged' THEN
            RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation';
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_one BEFORE INSERT ON execution_events
            FOR EACH ROW EXECUTE FUNCTION refuse_one();
    """)
    order = sorted(claimed)

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(d.lease, "completed",
                                                         result=d.lease.execution_id))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    assert isinstance(by_id.pop("check-3"), asyncpg.CheckViolationError)
    assert (await pool.fetchval("SELECT status FROM executions WHERE execution_id = 'check-3'")
            == "running")
    for eid, got in by_id.items():
        assert got == Acknowledged("completed", {"result": eid}), (eid, got)


async def test_a_takeover_committed_while_a_batch_row_waited_refuses_that_row_alone(
        store, pool):
    # The batch skips the row the claim holds; sent alone, it waits for the
    # claim, and its fence then sees the new token: LeaseLost, nothing written.
    claimed = await held(store, 5, "taken")
    blockers = [claimed.pop("taken-0"), claimed.pop("taken-1")]
    old = claimed["taken-3"].lease
    answered, waiting = await batch_while_held(
        store, pool, blockers, [claimed[e] for e in sorted(claimed)], held=["taken-3"],
        stalled=["taken-3"], takeover=True)
    assert answered == {eid: Acknowledged("completed", {"result": eid})
                        for eid in ("taken-2", "taken-4")}
    with pytest.raises(LeaseLost):
        await waiting["taken-3"]
    rec = await pool.fetchrow("SELECT status, token, lease_owner FROM executions "
                              "WHERE execution_id = 'taken-3'")
    assert rec is not None
    assert (rec["status"], rec["token"], rec["lease_owner"]) == (
        "running", old.token + 1, "worker-B")
    assert "acknowledged" not in await events(pool, "taken-3")
    rejected = await pool.fetch("SELECT token FROM execution_events WHERE execution_id = "
                                "'taken-3' AND kind = 'fenced_write_rejected'")
    assert [r["token"] for r in rejected] == [old.token]
