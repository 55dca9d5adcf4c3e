"""Step writes combined into one statement per batch (group commit), against
real Postgres: every write keeps its own fence (its own token), and each
caller gets its own answer.

A batch is formed deterministically: two "blocker" writes are held mid-flight
by a StatementGate (at their 'step_recorded' event, their execution rows
locked), which fills the combiner's two flushes in flight; writes submitted
then all wait, and go together in ONE statement when the gate opens. Each test
asserts from the combiner's counters that they did. The last test drops the
gate: many deliveries write at once, round after round, and it checks that
batches of several writes really happened and that every answer was right.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from app.store import Delivery, ExecutionStore, InvalidEvent, Lease, LeaseLost, StepRecord
from app.store.group_commit import GroupCommit
from app.store.steps import StepWrite, write_steps
from tests.support.admission import admitting
from tests.support.claims import claim, claim_one
from tests.support.races import STEP_WRITE, Outcomes, StatementGate, until_waiting
from tests.support.waiting import wait_until

admit = admitting("grouped")
BLOCKERS = ("blocker-1", "blocker-2")


def writer(store: ExecutionStore) -> GroupCommit[Any, Any]:
    assert store.steps.step_writes is not None, "on the pool, step writes are group-committed"
    return store.steps.step_writes


def timer_writer(store: ExecutionStore) -> GroupCommit[Any, Any]:
    assert store.steps.timer_writes is not None, "on the pool, timers are group-committed"
    return store.steps.timer_writes


async def claimed(store: ExecutionStore, ids: list[str]) -> dict[str, Delivery]:
    for eid in ids:
        await admit(store, eid)
    deliveries = await claim(store, "worker-1")
    assert sorted(deliveries) == sorted(ids)
    return deliveries


async def stale_and_current(store: ExecutionStore, clock, eid: str) -> tuple[Delivery, Delivery]:
    """`eid` claimed by A, A's lease expired, claimed again by B: (A, B)."""
    await admit(store, eid)
    a = await claim_one(store, eid, owner="worker-A")
    await clock.expire_lease(eid)
    b = await claim_one(store, eid, owner="worker-B")
    assert b.lease.token == a.lease.token + 1
    return a, b


async def in_one_batch(store: ExecutionStore, pool, blockers: dict[str, Delivery],
                       writes: list[Callable[[], Coroutine[Any, Any, Any]]], *,
                       timers: bool = False) -> list[Any]:
    """Run `writes` (each a step write, or with `timers` each a timer) so that
    they all go in ONE statement: the two blockers' writes of the same kind
    hold both flushes in flight while the writes are submitted. Returns each
    write's result or exception, in order."""
    gc = timer_writer(store) if timers else writer(store)
    when = ("NEW.kind = 'step_recorded' AND NEW.execution_id IN ("
            + ", ".join(f"'{b}'" for b in BLOCKERS) + ")")
    async with StatementGate(pool, "execution_events", when) as gate:
        held = [asyncio.create_task(
            store.steps.record_timer(blockers[b].lease, "block", delay_seconds=60) if timers
            else store.steps.write_step(blockers[b].lease, "block", value=b))
            for b in BLOCKERS]
        await gate.until_held(2)
        batches, requests = gc.batches, gc.requests
        tasks = [asyncio.create_task(w()) for w in writes]
        await asyncio.sleep(0)  # every write has been submitted, and waits
        assert (gc.batches, gc.requests) == (batches, requests), "nothing sent while both are held"
        await gate.open()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*held)
    assert (gc.batches - batches, gc.requests - requests) == (1, len(writes)), (
        "the writes went in one batch")
    return results


async def step_rows(pool, eid: str) -> dict[str, Any]:
    return {r["step_key"]: r for r in await pool.fetch(
        "SELECT step_key, token, value FROM execution_steps WHERE execution_id = $1", eid)}


async def events_of(pool, eid: str) -> list[Any]:
    return await pool.fetch(
        "SELECT kind, token, detail FROM execution_events WHERE execution_id = $1 "
        "AND kind IN ('step_recorded', 'fenced_write_rejected') ORDER BY event_id", eid)


async def test_a_stale_write_in_a_batch_is_refused_while_the_rest_commit(store, pool, clock):
    a, b = await stale_and_current(store, clock, "contested")
    fresh = await claimed(store, [*BLOCKERS, "fresh-1", "fresh-2", "fresh-3"])

    results = await in_one_batch(store, pool, fresh, [
        lambda: store.steps.write_step(fresh["fresh-1"].lease, "charge", value={"n": 1}),
        lambda: store.steps.write_step(a.lease, "charge", value={"by": "A"}),
        lambda: store.steps.write_step(fresh["fresh-2"].lease, "charge", value={"n": 2}),
        # B, the current holder of the same execution, in the same batch.
        lambda: store.steps.write_step(b.lease, "ship", value={"by": "B"}),
        lambda: store.steps.write_step(fresh["fresh-3"].lease, "charge",
                                       error={"name": "Declined", "message": "no"}),
    ])

    one, stale, two, current, three = results
    assert isinstance(stale, LeaseLost)
    assert (stale.execution_id, stale.token) == ("contested", a.lease.token)
    for eid, rec, want in [("fresh-1", one, {"n": 1}), ("fresh-2", two, {"n": 2})]:
        assert isinstance(rec, StepRecord), rec
        assert (rec.step_key, rec.status, rec.value) == ("charge", "completed", want)
        assert rec.token == fresh[eid].lease.token
        assert {k: (r["token"], r["value"]) for k, r in (await step_rows(pool, eid)).items()} == {
            "charge": (fresh[eid].lease.token, want)}
        assert [(e["kind"], e["token"], e["detail"]) for e in await events_of(pool, eid)] == [
            ("step_recorded", fresh[eid].lease.token,
             {"stepKey": "charge", "status": "completed"})]
    assert isinstance(three, StepRecord) and three.status == "failed"
    assert three.error == {"name": "Declined", "message": "no"}
    assert isinstance(current, StepRecord) and current.token == b.lease.token

    # The stale write left nothing but its refusal; B's write stands.
    assert {k: r["token"] for k, r in (await step_rows(pool, "contested")).items()} == {
        "ship": b.lease.token}
    assert [(e["kind"], e["token"], e["detail"]) for e in await events_of(pool, "contested")] == [
        ("step_recorded", b.lease.token, {"stepKey": "ship", "status": "completed"}),
        ("fenced_write_rejected", a.lease.token, {"stepKey": "charge"}),
    ]


async def test_a_stale_timer_in_a_batch_is_refused_while_the_rest_commit(store, pool, clock):
    """Timers are batched the same way: each keeps its own fence, its wake
    time from the database clock (or as given), its event naming it; a key
    given twice in the batch keeps the first's time."""
    a, b = await stale_and_current(store, clock, "contested")
    ds = await claimed(store, [*BLOCKERS, "nap-1", "nap-2"])
    until = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)

    results = await in_one_batch(store, pool, ds, [
        lambda: store.steps.record_timer(ds["nap-1"].lease, "nap", delay_seconds=30),
        lambda: store.steps.record_timer(a.lease, "nap", delay_seconds=5),
        lambda: store.steps.record_timer(ds["nap-2"].lease, "nap", until=until),
        lambda: store.steps.record_timer(b.lease, "nap", delay_seconds=10),
        lambda: store.steps.record_timer(ds["nap-1"].lease, "nap", delay_seconds=99),
    ], timers=True)

    nap_1, stale, nap_2, current, again = results
    assert isinstance(stale, LeaseLost) and stale.token == a.lease.token
    wake_1, now_1, interrupt = nap_1
    assert wake_1 - now_1 == timedelta(seconds=30) and interrupt is None
    assert again[0] == wake_1
    assert nap_2[0] == until
    assert current[0] - current[1] == timedelta(seconds=10)
    for eid, lease, wake in [("nap-1", ds["nap-1"].lease, wake_1), ("nap-2", ds["nap-2"].lease,
                                                                     until),
                             ("contested", b.lease, current[0])]:
        rows = await step_rows(pool, eid)
        assert {k: (r["token"], datetime.fromisoformat(r["value"])) for k, r in rows.items()} == {
            "nap": (lease.token, wake)}
        [event] = [e for e in await events_of(pool, eid) if e["kind"] == "step_recorded"]
        assert (event["token"], datetime.fromisoformat(event["detail"]["wakeAt"])) == (
            lease.token, wake)
    assert [(e["kind"], e["token"]) for e in await events_of(pool, "contested")] == [
        ("step_recorded", b.lease.token), ("fenced_write_rejected", a.lease.token)]


@pytest.mark.parametrize("bad", [
    pytest.param("a\u0000b", id="nul"),  # refused by the server
    pytest.param("\ud800", id="lone-surrogate"),  # refused by the driver
])
async def test_an_unstorable_value_in_a_batch_fails_only_its_own_write(store, pool, bad):
    ds = await claimed(store, [*BLOCKERS, "good-1", "bad", "good-2"])

    results = await in_one_batch(store, pool, ds, [
        lambda: store.steps.write_step(ds["good-1"].lease, "s", value="one"),
        lambda: store.steps.write_step(ds["bad"].lease, "s", value={"v": bad}),
        lambda: store.steps.write_step(ds["good-2"].lease, "s", error={"name": "E", "message": "m"}),
    ])

    good_1, invalid, good_2 = results
    assert isinstance(invalid, InvalidEvent), invalid
    assert isinstance(good_1, StepRecord) and good_1.value == "one"
    assert isinstance(good_2, StepRecord) and good_2.error == {"name": "E", "message": "m"}
    assert await step_rows(pool, "bad") == {}
    assert await events_of(pool, "bad") == []
    for eid in ("good-1", "good-2"):
        assert list(await step_rows(pool, eid)) == ["s"]
        assert [e["kind"] for e in await events_of(pool, eid)] == ["step_recorded"]
    # The delivery with the bad value goes on: its lease is untouched.
    assert (await store.steps.write_step(ds["bad"].lease, "s", value="ok")).value == "ok"


async def test_one_deliverys_writes_in_one_batch_keep_their_order(store, pool):
    """Concurrent writes of one delivery (concurrent branches) submitted in
    one batch: their events follow the order they were submitted in, not the
    keys' order; a key given twice is recorded once, by its first write, and
    both writers get that record."""
    ds = await claimed(store, [*BLOCKERS, "branches"])
    lease = ds["branches"].lease
    keys = ["zeta", "alpha", "mu", "alpha", "beta"]

    results = await in_one_batch(store, pool, ds, [
        (lambda k=k, i=i: store.steps.write_step(lease, k, value=i)) for i, k in enumerate(keys)])

    assert [(r.step_key, r.value, r.token) for r in results] == [
        ("zeta", 0, lease.token), ("alpha", 1, lease.token), ("mu", 2, lease.token),
        ("alpha", 1, lease.token), ("beta", 4, lease.token)]
    assert results[1] == results[3]
    assert {k: r["value"] for k, r in (await step_rows(pool, "branches")).items()} == {
        "zeta": 0, "alpha": 1, "mu": 2, "beta": 4}
    assert [e["detail"]["stepKey"] for e in await events_of(pool, "branches")] == [
        "zeta", "alpha", "mu", "beta"]


async def test_an_already_recorded_step_in_a_batch_returns_the_recorded_one(store, pool, clock):
    """A write of a step already recorded (a redelivery's, or a retry's): the
    recorded step stands and is returned (read for all such writes of the
    batch at once); a stale holder's write of it in the same batch is refused."""
    a, b = await stale_and_current(store, clock, "redelivered")
    ds = await claimed(store, [*BLOCKERS, "other"])
    first = await store.steps.write_step(b.lease, "charge", value="first")
    other_first = await store.steps.write_step(ds["other"].lease, "charge", value="other-first")

    again, stale, other = await in_one_batch(store, pool, ds, [
        lambda: store.steps.write_step(b.lease, "charge", value="second"),
        lambda: store.steps.write_step(a.lease, "charge", value="stale"),
        lambda: store.steps.write_step(ds["other"].lease, "charge", value="other-second"),
    ])

    assert again == first and again.value == "first"
    assert other == other_first
    assert isinstance(stale, LeaseLost) and stale.token == a.lease.token
    assert [(e["kind"], e["token"]) for e in await events_of(pool, "redelivered")] == [
        ("step_recorded", b.lease.token), ("fenced_write_rejected", a.lease.token)]
    assert [e["kind"] for e in await events_of(pool, "other")] == ["step_recorded"]


async def test_each_deliverys_writes_stay_in_order_while_others_write(store, pool):
    """Deliveries writing their steps one after another, all at once: each
    delivery's steps and events are in its order, whatever was batched with
    what."""
    ids = [f"seq-{i}" for i in range(12)]
    ds = await claimed(store, ids)
    keys = [f"step-{n}" for n in range(6)]

    async def run(eid: str) -> None:
        for n, key in enumerate(keys):
            rec = await store.steps.write_step(ds[eid].lease, key, value=n, position=n)
            assert (rec.step_key, rec.value) == (key, n)

    gc = writer(store)
    batches, requests = gc.batches, gc.requests
    await asyncio.gather(*(run(eid) for eid in ids))
    assert gc.requests - requests == len(ids) * len(keys)
    assert gc.batches - batches < gc.requests - requests, "some writes were combined"
    for eid in ids:
        assert [e["detail"]["stepKey"] for e in await events_of(pool, eid)] == keys


async def test_concurrent_deliveries_with_stale_ones_each_get_their_own_answer(
    store, pool, clock
):
    """Without a gate: rounds of ten deliveries writing at once, three of
    them stale holders. Each answer is right for its own token, whichever
    writes went together. Both cases happened: a stale write sent alone, and
    one in a batch with current holders' writes (the batches are recorded by
    wrapping the store's own flush)."""
    random.seed(18)
    sent: list[list[Any]] = []

    async def recording_flush(writes: list[Any]) -> Any:
        sent.append(writes)
        return await store.steps.flush_step_writes(writes)

    store.steps.step_writes = GroupCommit(recording_flush)
    seen = Outcomes("stale-alone", "stale-with-current")
    for r in seen.rounds(20, 200):
        ids = [f"r{r}-{i}" for i in range(10)]
        ds = await claimed(store, ids)
        stale = set(random.sample(ids, 3))
        for eid in stale:
            await clock.expire_lease(eid)
        assert sorted(await claim(store, "worker-2")) == sorted(stale)
        leases = {eid: ds[eid].lease for eid in ids}
        del sent[:]

        async def write(eid: str, lease: Lease) -> StepRecord | LeaseLost:
            if random.random() < 0.5:
                await asyncio.sleep(random.random() * 0.002)
            try:
                return await store.steps.write_step(lease, "s", value=eid)
            except LeaseLost as exc:
                return exc

        answers = dict(zip(ids, await asyncio.gather(*(write(e, leases[e]) for e in ids)),
                           strict=True))
        for batch in sent:
            batch_ids = {w.lease.execution_id for w in batch}
            for _ in batch_ids & stale:
                seen.add("stale-with-current" if batch_ids - stale else "stale-alone",
                         f"round {r}")
        for eid, answer in answers.items():
            if eid in stale:
                assert isinstance(answer, LeaseLost), (eid, answer)
                assert await step_rows(pool, eid) == {}
                assert [(e["kind"], e["token"]) for e in await events_of(pool, eid)] == [
                    ("fenced_write_rejected", leases[eid].token)]
            else:
                assert isinstance(answer, StepRecord), (eid, answer)
                assert (answer.value, answer.token) == (eid, leases[eid].token)
                assert [(e["kind"], e["token"]) for e in await events_of(pool, eid)] == [
                    ("step_recorded", leases[eid].token)]
    seen.assert_each("10 writes at once, 3 of them stale", "stale writes")


class HeldRow:
    """One execution row held by another transaction (an operator's cancel, a
    bulk update, a renewal), from a connection of its own: `FOR UPDATE`, or
    an UPDATE of the row (`change`) that commits on release."""

    def __init__(self, pool, execution_id: str, change: str | None = None) -> None:
        self.pool, self.execution_id, self.change = pool, execution_id, change
        self.released = False

    async def __aenter__(self) -> HeldRow:
        self.conn = await self.pool.acquire()
        self.tx = self.conn.transaction()
        await self.tx.start()
        sql = (f"UPDATE executions SET {self.change} WHERE execution_id = $1 RETURNING 1"
               if self.change else "SELECT 1 FROM executions WHERE execution_id = $1 FOR UPDATE")
        assert await self.conn.fetchval(sql, self.execution_id) == 1
        return self

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await (self.tx.commit() if self.change else self.tx.rollback())
            await self.pool.release(self.conn)

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


async def committed_steps(open_pool, eid: str) -> dict[str, int]:
    """The steps of `eid` another connection sees committed, with their tokens."""
    other = await open_pool()
    return {r["step_key"]: r["token"] for r in await other.fetch(
        "SELECT step_key, token FROM execution_steps WHERE execution_id = $1", eid)}


@pytest.mark.parametrize("timers", [False, True], ids=["step", "timer"])
@pytest.mark.parametrize("change", [None, "cancel_requested_at = now()"],
                         ids=["locked-rolled-back", "cancel-committed"])
async def test_a_row_held_elsewhere_holds_back_only_its_own_write(
        store, pool, open_pool, timers, change):
    """Another transaction holds one execution row of a batch: the batch does
    not wait for it. The other writes commit at once, while the row is still
    held; the held row's write waits for it alone (as a single write always
    did), then commits with its own token, and sees what the holder
    committed (a cancel: its interrupt)."""
    ds = await claimed(store, [*BLOCKERS, "good-1", "held", "good-2"])
    goods = ("good-1", "good-2")
    seen_while_held: dict[str, dict[str, int]] = {}
    both_done = asyncio.Event()

    def write(eid: str) -> Coroutine[Any, Any, Any]:
        if timers:
            return store.steps.record_timer(ds[eid].lease, "s", delay_seconds=30)
        return store.steps.write_step(ds[eid].lease, "s", value=eid)

    async def good(eid: str) -> Any:
        answer = await write(eid)
        if not row.released:
            seen_while_held[eid] = await committed_steps(open_pool, eid)
        if len(seen_while_held) == len(goods):
            both_done.set()
        return answer

    async def release_after_the_others() -> None:
        # Held until both others answered (at most 5 s: a batch that waits
        # for the held row answers them only after this releases it), and
        # the held row's own write waits for the lock.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(both_done.wait(), 5)
        await until_waiting(pool, 1, "row", what="the held row's write", query=STEP_WRITE,
                            also=lambda: held.done())
        await row.release()

    async with HeldRow(pool, "held", change) as row:
        held: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        releaser = asyncio.create_task(release_after_the_others())

        async def held_write() -> Any:
            try:
                answer = await write("held")
            except BaseException as exc:
                held.set_exception(exc)
                raise
            held.set_result(answer)
            assert row.released, "the held row's write waited for the lock"
            return answer

        results = await in_one_batch(store, pool, ds, [
            lambda: good("good-1"), held_write, lambda: good("good-2")], timers=timers)
        await releaser

    assert seen_while_held == {eid: {"s": ds[eid].lease.token} for eid in goods}, (
        "the others committed while the row was held")
    for eid, answer in zip(("good-1", "held", "good-2"), results, strict=True):
        assert not isinstance(answer, BaseException), (eid, answer)
        interrupt = answer[2] if timers else answer.interrupt
        assert interrupt == ("cancel" if change and eid == "held" else None), (eid, answer)
        if not timers:
            assert (answer.token, answer.value) == (ds[eid].lease.token, eid)
        assert {k: r["token"] for k, r in (await step_rows(pool, eid)).items()} == {
            "s": ds[eid].lease.token}
        assert [(e["kind"], e["token"]) for e in await events_of(pool, eid)] == [
            ("step_recorded", ds[eid].lease.token)]


@pytest.mark.parametrize("timers", [False, True], ids=["step", "timer"])
async def test_a_claim_holding_a_row_of_a_batch_refuses_that_write_once_it_commits(
        store, pool, timers):
    """A claim (another worker's, after this lease expired) has bumped one
    row's token and not committed yet: the batch answers the others at once;
    that row's write waits for the claim alone, then is refused (its token
    is no longer current), recorded as a fenced_write_rejected."""
    ds = await claimed(store, [*BLOCKERS, "a-good", "x-contested", "z-good"])

    def write(eid: str) -> Coroutine[Any, Any, Any]:
        if timers:
            return store.steps.record_timer(ds[eid].lease, "s", delay_seconds=30)
        return store.steps.write_step(ds[eid].lease, "s", value=eid)

    thief = HeldRow(pool, "x-contested", "token = token + 1, lease_owner = 'thief'")
    async with thief:
        tasks: dict[str, asyncio.Task[Any]] = {}

        def start(eid: str) -> Callable[[], Coroutine[Any, Any, Any]]:
            async def run() -> Any:
                tasks[eid] = asyncio.current_task()  # type: ignore[assignment]
                return await write(eid)
            return run

        async def commit_the_claim() -> None:
            await wait_until(lambda: len(tasks) == 3 and tasks["a-good"].done()
                             and tasks["z-good"].done(), what="the others answered")
            assert not tasks["x-contested"].done()
            await until_waiting(pool, 1, "row", what="the contested write",
                                query=STEP_WRITE)
            await thief.release()

        committer = asyncio.create_task(commit_the_claim())
        results = await in_one_batch(store, pool, ds, [
            start("a-good"), start("x-contested"), start("z-good")], timers=timers)
        await committer

    good_a, contested, good_z = results
    assert isinstance(contested, LeaseLost), contested
    assert (contested.execution_id, contested.token) == ("x-contested",
                                                         ds["x-contested"].lease.token)
    assert await step_rows(pool, "x-contested") == {}
    assert [(e["kind"], e["token"]) for e in await events_of(pool, "x-contested")] == [
        ("fenced_write_rejected", ds["x-contested"].lease.token)]
    for eid in ("a-good", "z-good"):
        assert {k: r["token"] for k, r in (await step_rows(pool, eid)).items()} == {
            "s": ds[eid].lease.token}


async def test_the_batch_statement_tells_a_held_row_from_a_stale_token(store, pool, clock):
    """The batch statement skips a row another transaction holds and says so
    (`skipped`: its write is to be done again, waiting); a stale token is
    refused at once, held row or not; nothing is written for either."""
    a, b = await stale_and_current(store, clock, "held")
    stale, current = await stale_and_current(store, clock, "contested")
    ds = await claimed(store, ["fresh"])

    def w(lease: Lease) -> StepWrite:
        return StepWrite(lease, "s", "completed", '"v"', None, "f", 1, None)

    async with HeldRow(pool, "held"):
        answers = await write_steps(
            store.pool, [w(ds["fresh"].lease), w(b.lease), w(a.lease), w(stale.lease)],
            skip_locked=True)
        assert [(x.fenced, x.skipped) for x in answers] == [
            (True, False), (False, True), (False, False), (False, False)]
        assert await step_rows(pool, "held") == {}
        assert await step_rows(pool, "contested") == {}
        assert list(await step_rows(pool, "fresh")) == ["s"]
    del current


@pytest.mark.parametrize("timers", [False, True], ids=["step", "timer"])
async def test_any_error_of_one_writes_own_fails_only_that_write(store, pool, timers):
    """A step key too long for the index (a program limit, not a data error)
    fails the batch's statement: each write is then done alone, and only that
    one gets the error it gets alone."""
    ds = await claimed(store, [*BLOCKERS, "good-1", "bad", "good-2", "alone"])
    # Random, so that compression cannot bring it under the index's limit.
    huge = random.Random(18).randbytes(6000).hex()

    def write(eid: str, key: str = "s") -> Coroutine[Any, Any, Any]:
        if timers:
            return store.steps.record_timer(ds[eid].lease, key, delay_seconds=30)
        return store.steps.write_step(ds[eid].lease, key, value=eid)

    async with store.transaction() as tx:
        with pytest.raises(asyncpg.ProgramLimitExceededError) as alone:
            await (tx.steps.record_timer(ds["alone"].lease, huge, delay_seconds=30) if timers
                   else tx.steps.write_step(ds["alone"].lease, huge, value="alone"))
    results = await in_one_batch(store, pool, ds, [
        lambda: write("good-1"), lambda: write("bad", huge), lambda: write("good-2")],
        timers=timers)

    good_1, bad, good_2 = results
    assert type(bad) is type(alone.value), bad
    for eid, answer in (("good-1", good_1), ("good-2", good_2)):
        assert not isinstance(answer, BaseException), (eid, answer)
        assert {k: r["token"] for k, r in (await step_rows(pool, eid)).items()} == {
            "s": ds[eid].lease.token}
    assert await step_rows(pool, "bad") == {}


async def test_the_waiting_statement_checks_the_token_again_after_the_wait(store, pool):
    """The statement a skipped write is done again by waits for the held
    row, then checks the token on the row's latest version: a claim that
    moved the token while it waited refuses that write, and the others of
    the same statement commit."""
    ds = await claimed(store, ["a-good", "x-contested", "z-good"])

    def w(eid: str) -> StepWrite:
        return StepWrite(ds[eid].lease, "s", "completed", '"v"', None, "f", 1, None)

    thief = HeldRow(pool, "x-contested", "token = token + 1, lease_owner = 'thief'")
    async with thief:
        task = asyncio.create_task(
            write_steps(store.pool, [w("a-good"), w("x-contested"), w("z-good")]))
        await until_waiting(pool, 1, "row", what="the statement", query=STEP_WRITE,
                            also=task.done)
        assert not task.done(), "the statement waits for the held row"
        await thief.release()
        answers = await task
    assert [(a.fenced, a.skipped) for a in answers] == [(True, False), (False, False),
                                                       (True, False)]
    assert [(r["execution_id"], r["token"]) for r in await pool.fetch(
        "SELECT execution_id, token FROM execution_steps ORDER BY 1")] == [
        ("a-good", ds["a-good"].lease.token), ("z-good", ds["z-good"].lease.token)]


async def test_a_held_deliverys_writes_in_one_batch_keep_their_order(store, pool):
    """Concurrent writes of one delivery in one batch while its execution
    row is held elsewhere: all of them wait for the row together, then are
    recorded in the order they were submitted; a key given twice keeps its
    first write's value, and both writers get that record."""
    ds = await claimed(store, [*BLOCKERS, "branches"])
    lease = ds["branches"].lease
    keys = ["zeta", "alpha", "mu", "alpha", "beta"]

    async with HeldRow(pool, "branches") as row:
        async def release_when_waited_for() -> None:
            await until_waiting(pool, 1, "row", what="the delivery's writes",
                                query=STEP_WRITE)
            await row.release()

        releaser = asyncio.create_task(release_when_waited_for())
        results = await in_one_batch(store, pool, ds, [
            (lambda k=k, i=i: store.steps.write_step(lease, k, value=i))
            for i, k in enumerate(keys)])
        await releaser

    assert [(r.step_key, r.value, r.token) for r in results] == [
        ("zeta", 0, lease.token), ("alpha", 1, lease.token), ("mu", 2, lease.token),
        ("alpha", 1, lease.token), ("beta", 4, lease.token)]
    assert [e["detail"]["stepKey"] for e in await events_of(pool, "branches")] == [
        "zeta", "alpha", "mu", "beta"]


@pytest.mark.parametrize("timers", [False, True], ids=["step", "timer"])
@pytest.mark.parametrize("stopped", ["waiting-for-the-row", "before-its-batch-answered"])
async def test_a_held_write_whose_caller_stopped_waiting_is_cancelled_with_it(
        store, pool, open_pool, store_settings, timers, stopped):
    """A delivery stops (lease lost, forced stop, shutdown) while its write
    waits for an execution row another transaction holds: the statement
    waiting for the row is cancelled with its caller. Nothing of it commits
    after the caller is gone (a cancelled statement rolls back), and its
    connection goes back to the pool at once: a worker's pool closes without
    waiting for the holder. Both moments a caller can stop are forced: while
    the write waits for the row, and while its batch (which skipped it) has
    not answered yet (the batch's answers are held back until the caller
    was cancelled)."""
    ds = await claimed(store, ["gone"])
    lease = ds["gone"].lease
    own = await open_pool(max_size=4)
    steps = ExecutionStore.from_settings(own, store_settings).steps  # a worker's own pool
    cancelled = asyncio.Event()
    if stopped == "before-its-batch-answered":
        flush = steps.flush_timers if timers else steps.flush_step_writes

        async def answered_after_the_cancel(writes: list[Any]) -> Any:
            answers = await flush(writes)
            await cancelled.wait()
            return answers

        if timers:
            steps.timer_writes = GroupCommit(answered_after_the_cancel)
        else:
            steps.step_writes = GroupCommit(answered_after_the_cancel)

    async with HeldRow(pool, "gone"):
        write = asyncio.ensure_future(
            steps.record_timer(lease, "k", delay_seconds=30) if timers
            else steps.write_step(lease, "k", value=1))
        await wait_until(lambda: len(steps.held_writes) == 1, what="the write held back")
        await until_waiting(pool, 1, "row", what="the held write", query=STEP_WRITE)
        write.cancel()
        cancelled.set()
        await asyncio.gather(write, return_exceptions=True)
        assert write.cancelled()
        await wait_until(lambda: not steps.held_writes, timeout=5,
                         what="the held write cancelled with its caller")
        closing = asyncio.ensure_future(own.close())
        done, _ = await asyncio.wait({closing}, timeout=5)
        assert done, "the pool closes while the row is still held: no statement keeps a connection"
    await closing
    assert await step_rows(pool, "gone") == {}, "nothing committed after the caller was gone"
    assert await events_of(pool, "gone") == []


async def test_a_held_write_goes_on_while_one_of_its_callers_still_waits(store, pool):
    """Two writes of one delivery, skipped by their batch and waiting for the
    held row in one statement: one caller stops, the other still waits, so
    the statement goes on; once the row is released both commit together
    (a sent write commits or not with the rest of its statement), and the
    caller still waiting gets its answer."""
    ds = await claimed(store, [*BLOCKERS, "pair"])
    lease = ds["pair"].lease
    stopping: list[asyncio.Task[Any]] = []

    async def stops() -> Any:
        task = asyncio.current_task()
        assert task is not None
        stopping.append(task)
        return await store.steps.write_step(lease, "stops", value=0)

    async with HeldRow(pool, "pair") as row:
        async def stop_one_then_release() -> None:
            await until_waiting(pool, 1, "row", what="the delivery's writes",
                                query=STEP_WRITE)
            assert len(store.steps.held_writes) == 1
            stopping[0].cancel()
            await asyncio.sleep(0.2)
            assert len(store.steps.held_writes) == 1, "still written: a caller waits for it"
            await row.release()

        releaser = asyncio.create_task(stop_one_then_release())
        results = await in_one_batch(store, pool, ds, [
            stops, lambda: store.steps.write_step(lease, "waits", value=1)])
        await releaser

    assert isinstance(results[0], asyncio.CancelledError)
    assert (results[1].step_key, results[1].value, results[1].token) == ("waits", 1, lease.token)
    assert {k: r["token"] for k, r in (await step_rows(pool, "pair")).items()} == {
        "stops": lease.token, "waits": lease.token}


async def test_cancel_held_writes_ends_every_write_waiting_for_a_row(
        store, pool, open_pool, store_settings):
    """A stopping worker cancels the writes still waiting for a held row
    (what its pool's close would otherwise wait for): their callers are
    answered cancelled, nothing of them commits, and the pool closes while
    the row is still held."""
    ds = await claimed(store, ["stop"])
    own = await open_pool(max_size=4)
    steps = ExecutionStore.from_settings(own, store_settings).steps
    async with HeldRow(pool, "stop"):
        write = asyncio.ensure_future(steps.write_step(ds["stop"].lease, "k", value=1))
        await wait_until(lambda: len(steps.held_writes) == 1, what="the write held back")
        await until_waiting(pool, 1, "row", what="the held write", query=STEP_WRITE)
        await asyncio.wait_for(steps.cancel_held_writes(), 5)
        assert not steps.held_writes
        [answer] = await asyncio.gather(write, return_exceptions=True)
        assert isinstance(answer, asyncio.CancelledError), answer
        await asyncio.wait_for(own.close(), 5)
    assert await step_rows(pool, "stop") == {}
    assert await events_of(pool, "stop") == []
