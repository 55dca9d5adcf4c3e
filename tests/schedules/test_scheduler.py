"""The Scheduler against real Postgres: several workers admit each slot once,
catch-up after downtime, pause, a crash between admission and advance,
daylight saving through the whole path, and broken schedules.

Time moves by UPDATE-ing last_slot (and, for past DST days, by run_once's
`until`), never by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from datetime import UTC, datetime

import pytest

from app import cron
from app.db import create_pool
from app.scheduler import Scheduler
from app.store import ExecutionStore, Schedules, ScheduleTurn
from tests.schedules.conftest import WORKFLOWS
from tests.support.races import StatementGate


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


async def last_slot(pool, schedule_id: str) -> datetime:
    return await pool.fetchval("SELECT last_slot FROM schedules WHERE schedule_id = $1",
                               schedule_id)


def ids(schedule_id: str, expression: str, tz: str, after: datetime, until: datetime) -> list[str]:
    admit, _ = cron.slots(cron.parse(expression), cron.zone(tz), after, until, 10**6)
    return [cron.slot_id(schedule_id, s) for s in admit]


@contextlib.asynccontextmanager
async def worker_stores(settings, n: int, store_class=ExecutionStore):
    """n stores, each on its own pool: n workers sharing one database."""
    pools = [await create_pool(settings) for _ in range(n)]
    try:
        yield [store_class.from_settings(p, settings) for p in pools]
    finally:
        for p in pools:
            await p.close()


class UnlockedSchedules(Schedules):
    """Schedule turns that take no lock: evaluations overlap freely,
    so only the unique execution ID (the 409) stands between a slot and a
    second admission."""

    @contextlib.asynccontextmanager
    async def schedule_turn(self, schedule_id):
        async with self.db.connection() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT *, now() AS db_now FROM schedules WHERE schedule_id = $1 AND NOT paused",
                schedule_id,
            )
            if row is None:
                yield None
                return
            schedule = dict(row)
            yield ScheduleTurn(conn, schedule, schedule.pop("db_now"))


class UnlockedStore(ExecutionStore):
    """A store whose schedules are UnlockedSchedules."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedules = UnlockedSchedules(self.pool, self.config)


# ------------------------------------------------------------- exactly once


@pytest.mark.parametrize("store_class", [ExecutionStore, UnlockedStore],
                         ids=["row-lock", "no-lock-409-only"])
async def test_three_workers_admit_each_slot_once(settings, pool, make_schedule, set_last_slot,
                                                  executions_of, store_class):
    await make_schedule("five", "*/5 * * * *", catch_up=1000)
    await make_schedule("daily", "0 0 * * *", tz="Europe/Warsaw", catch_up=1000)
    earliest = {"five": await last_slot(pool, "five"), "daily": await last_slot(pool, "daily")}
    rng = random.Random(7)
    admitted: Counter[str] = Counter()
    conflicts = 0
    # Slots one scheduler admitted and another was refused in the same round:
    # their evaluations of the schedule overlapped.
    overlapping = 0
    async with worker_stores(settings, 3, store_class) as stores:
        schedulers = [Scheduler(s, WORKFLOWS, catch_up_default=1, interval=1) for s in stores]
        for _ in range(12):
            # Re-open a window that overlaps what earlier rounds fired: each
            # round re-evaluates old slots and reaches further back.
            hours, days = rng.randint(1, 6), rng.randint(1, 9)
            await set_last_slot("five", f"date_trunc('hour', now()) - interval '{hours} hours'")
            await set_last_slot("daily", f"date_trunc('day', now()) - interval '{days} days'")
            for name in earliest:
                earliest[name] = min(earliest[name], await last_slot(pool, name))
            passes = await asyncio.gather(*(s.run_once() for s in schedulers))
            for p in passes:
                admitted.update(p.admitted)
                conflicts += len(p.conflicts)
            this_round = {slot for p in passes for slot in p.admitted}
            overlapping += sum(slot in this_round for p in passes for slot in p.conflicts)
    print(f"\n{store_class.__name__}: {len(admitted)} slots admitted, {conflicts} refused, "
          f"{overlapping} of them in overlapping evaluations")
    assert admitted and max(admitted.values()) == 1, admitted.most_common(3)
    if store_class is UnlockedStore:
        # The evaluations really overlapped, and only the unique ID saved the slot.
        assert overlapping > 0
    else:
        # The row lock: a worker evaluates after another's turn, never during it.
        assert overlapping == 0
    assert await executions_of("five") == ids("five", "*/5 * * * *", "UTC", earliest["five"],
                                              await last_slot(pool, "five"))
    assert await executions_of("daily") == ids("daily", "0 0 * * *", "Europe/Warsaw",
                                               earliest["daily"], await last_slot(pool, "daily"))
    assert sorted(admitted) == sorted(await executions_of("five") + await executions_of("daily"))
    assert conflicts > 0  # re-evaluated slots were refused by the unique execution ID
    # One schedule_fired event per admitted slot, whoever admitted it.
    fired = await pool.fetchval(
        "SELECT count(*) FROM schedule_events WHERE kind = 'schedule_fired'")
    assert fired == len(admitted)


async def test_row_lock_lets_one_worker_evaluate_a_schedule_at_a_time(
        settings, pool, make_schedule, set_last_slot, executions_of):
    await make_schedule("s", "0 * * * *", catch_up=1000)
    await set_last_slot("s", "date_trunc('hour', now()) - interval '5 hours'")
    async with worker_stores(settings, 3) as stores:
        schedulers = [Scheduler(s, WORKFLOWS, interval=1) for s in stores]
        passes = await asyncio.gather(*(s.run_once() for s in schedulers))
    assert sum(p.evaluated for p in passes) >= 1
    assert sum(len(p.admitted) for p in passes) == len(await executions_of("s")) >= 5
    assert sum(len(p.conflicts) for p in passes) == 0


async def test_a_worker_arriving_during_anothers_turn_passes_over_the_schedule(
        settings, pool, make_schedule, set_last_slot, executions_of):
    """The interleaving the row lock is for, forced: worker 1's turn is held
    mid-admission (a StatementGate on the slot's insert) while workers 2 and
    3 run a whole pass. They find the schedule locked and pass over it
    (nothing evaluated, admitted or refused); worker 1 then admits every
    slot, and a pass after its turn finds nothing left."""
    await make_schedule("s", "0 * * * *", catch_up=1000)
    await set_last_slot("s", "date_trunc('hour', now()) - interval '5 hours'")
    async with worker_stores(settings, 3) as stores:
        first, *others = [Scheduler(s, WORKFLOWS, interval=1) for s in stores]
        async with StatementGate(pool, "executions",
                                 "NEW.context->>'scheduleId' = 's'") as gate:
            turn = asyncio.create_task(first.run_once())
            await gate.until_held(also=turn.done)
            during = await asyncio.gather(*(o.run_once() for o in others))
            assert not turn.done()
            await gate.open()
            held = await turn
        after = await asyncio.gather(*(o.run_once() for o in others))
    assert [(p.evaluated, p.admitted, p.conflicts) for p in during] == [(0, [], [])] * 2
    assert held.evaluated == 1 and not held.conflicts
    assert sorted(held.admitted) == await executions_of("s") and len(held.admitted) >= 5
    assert [(p.admitted, p.conflicts) for p in after] == [([], [])] * 2


async def test_a_crash_between_admission_and_advance_refires_nothing(
        store, pool, make_schedule, set_last_slot, executions_of):
    await make_schedule("s", "0 * * * *", catch_up=5)
    await set_last_slot("s", "date_trunc('hour', now()) - interval '3 hours'")
    first = await Scheduler(store, WORKFLOWS).run_once()
    assert len(first.admitted) >= 3 and not first.conflicts
    # The worker "died" before moving last_slot: the next pass sees the same slots.
    await set_last_slot("s", "date_trunc('hour', now()) - interval '3 hours'")
    second = await Scheduler(store, WORKFLOWS).run_once()
    assert second.admitted == [] and sorted(second.conflicts) == sorted(first.admitted)
    assert await executions_of("s") == sorted(first.admitted)


# ----------------------------------------------------------------- catch-up


async def _downtime(store, pool, make_schedule, set_last_slot, *, catch_up=None, default=1):
    await make_schedule("s", "0 * * * *", catch_up=catch_up)
    after_sql = "date_trunc('hour', now()) - interval '10 hours'"
    await set_last_slot("s", after_sql)
    after = await last_slot(pool, "s")
    result = await Scheduler(store, WORKFLOWS, catch_up_default=default).run_once()
    until = await last_slot(pool, "s")
    every = ids("s", "0 * * * *", "UTC", after, until)
    return result, every


async def test_catch_up_1_admits_only_the_newest_slot_and_records_the_skipped(
        store, pool, make_schedule, set_last_slot, executions_of):
    result, every = await _downtime(store, pool, make_schedule, set_last_slot)
    assert len(every) == 10  # (now - 10 h, now] holds ten hourly slots
    assert result.admitted == every[-1:] == await executions_of("s")
    assert result.skipped == 9
    events = await store.schedules.schedule_events("s")
    skipped = [e for e in events if e["kind"] == "schedule_slots_skipped"]
    assert len(skipped) == 1 and skipped[0]["detail"]["skipped"] == 9
    assert skipped[0]["detail"]["catchUp"] == 1
    assert skipped[0]["detail"]["firstAdmitted"] == every[-1].split("~", 1)[1][:-1] + ":00Z"
    fired = [e for e in events if e["kind"] == "schedule_fired"]
    assert [e["detail"]["executionId"] for e in fired] == every[-1:]
    # Nothing more to do on the next pass, and no second skip event.
    again = await Scheduler(store, WORKFLOWS).run_once()
    assert again.admitted == [] and again.skipped == 0
    assert [e["kind"] for e in await store.schedules.schedule_events("s")].count(
        "schedule_slots_skipped") == 1


async def test_catch_up_3_on_the_schedule_admits_the_newest_three(
        store, pool, make_schedule, set_last_slot, executions_of):
    result, every = await _downtime(store, pool, make_schedule, set_last_slot, catch_up=3)
    assert result.admitted == every[-3:] == await executions_of("s")
    assert result.skipped == len(every) - 3 == 7


async def test_the_worker_default_applies_when_the_schedule_has_none(
        store, pool, make_schedule, set_last_slot, executions_of):
    result, every = await _downtime(store, pool, make_schedule, set_last_slot, default=3)
    assert result.admitted == every[-3:] and result.skipped == 7


async def test_nothing_before_creation_fires(store, make_schedule, executions_of):
    await make_schedule("s", "* * * * *")
    result = await Scheduler(store, WORKFLOWS).run_once()
    assert result.admitted == [] and await executions_of("s") == []


# -------------------------------------------------------------------- pause


async def test_paused_schedules_admit_nothing_and_resume_does_not_backfill(
        store, pool, make_schedule, set_last_slot, executions_of):
    await make_schedule("s", "* * * * *")
    await set_last_slot("s", "now() - interval '2 hours'")
    paused = await store.schedules.set_schedule_paused("s", True, by="ops")
    assert paused["paused"]
    before = await last_slot(pool, "s")
    result = await Scheduler(store, WORKFLOWS).run_once()
    assert result.admitted == [] and result.evaluated == 0
    assert await last_slot(pool, "s") == before
    resumed = await store.schedules.set_schedule_paused("s", False, by="ops")
    # Resuming moved last_slot to the resume time: the paused hours never fire.
    assert not resumed["paused"] and resumed["last_slot"] == resumed["updated_at"]
    assert (await Scheduler(store, WORKFLOWS).run_once()).admitted == []
    assert await executions_of("s") == []
    kinds = [e["kind"] for e in await store.schedules.schedule_events("s")]
    assert kinds == ["schedule_created", "schedule_paused", "schedule_resumed"]


# ---------------------------------------------------------------------- DST


async def test_dst_through_the_scheduler(store, pool, make_schedule, set_last_slot,
                                         executions_of):
    """Replaying 2025's transitions in Warsaw: a daily 02:30 fires once on
    each transition day; an hourly one gives 24 slots for the 25-hour day."""
    await make_schedule("nightly", "30 2 * * *", tz="Europe/Warsaw", params={"day": None})
    scheduler = Scheduler(store, WORKFLOWS, catch_up_default=1000)
    await set_last_slot("nightly", "'2025-03-29T23:00Z'")  # 30 March 00:00 CET
    await scheduler.run_once(until=utc(2025, 3, 30, 22))  # 31 March 00:00 CEST
    assert await executions_of("nightly") == ["nightly~2025-03-30T01:30Z"]
    await set_last_slot("nightly", "'2025-10-25T22:00Z'")  # 26 October 00:00 CEST
    await scheduler.run_once(until=utc(2025, 10, 26, 23))  # 27 October 00:00 CET
    assert await executions_of("nightly") == ["nightly~2025-03-30T01:30Z",
                                              "nightly~2025-10-26T00:30Z"]
    record = await store.history.get("nightly~2025-03-30T01:30Z")
    assert record["workflow_id"] == "sched-test-plain" and record["params"] == {"day": None}
    assert record["context"] == {"scheduleId": "nightly", "scheduledAt": "2025-03-30T01:30:00Z"}

    await make_schedule("hourly", "0 * * * *", tz="Europe/Warsaw")
    await set_last_slot("hourly", "'2025-10-25T22:00Z'")
    await scheduler.run_once(until=utc(2025, 10, 26, 23))
    fired = await executions_of("hourly")
    assert len(fired) == 24 and "hourly~2025-10-26T01:00Z" not in fired
    assert await last_slot(pool, "hourly") == utc(2025, 10, 26, 23)


# --------------------------------------------------------- what is evaluated


async def test_only_schedules_of_this_workers_workflows(store, make_schedule, set_last_slot,
                                                        executions_of):
    await make_schedule("other", "* * * * *", workflow_id="not-run-here")
    await set_last_slot("other", "now() - interval '1 hour'")
    result = await Scheduler(store, WORKFLOWS).run_once()
    assert result.evaluated == 0 and await executions_of("other") == []


async def test_a_broken_schedule_does_not_stop_the_others(store, pool, make_schedule,
                                                          set_last_slot, executions_of, caplog):
    await make_schedule("bad-cron", "* * * * *")
    await make_schedule("bad-zone", "* * * * *")
    await make_schedule("good", "0 * * * *")
    await pool.execute("UPDATE schedules SET cron = '61 * * * *' WHERE schedule_id = 'bad-cron'")
    await pool.execute("UPDATE schedules SET timezone = 'Nowhere/Atlantis' "
                       "WHERE schedule_id = 'bad-zone'")
    for s in ("bad-cron", "bad-zone", "good"):
        await set_last_slot(s, "date_trunc('hour', now()) - interval '1 hour'")
    scheduler = Scheduler(store, WORKFLOWS)
    result = await scheduler.run_once()
    assert result.admitted == await executions_of("good") and len(result.admitted) == 1
    assert "cannot be evaluated here" in caplog.text
    await scheduler.run_once()  # reported once, not every pass
    assert caplog.text.count("cannot be evaluated here") == 2


async def test_schedule_events_are_pruned_after_retention(store, pool, make_schedule,
                                                          set_last_slot):
    await make_schedule("s", "0 * * * *", catch_up=2)
    await set_last_slot("s", "date_trunc('hour', now()) - interval '4 hours'")
    scheduler = Scheduler(store, WORKFLOWS, retention_seconds=3600)
    await scheduler.run_once()
    assert len(await store.schedules.schedule_events("s")) == 4  # created, 2 fired, 1 skipped
    await pool.execute("UPDATE schedule_events SET at = at - interval '2 hours' "
                       "WHERE schedule_id = 's' AND kind = 'schedule_fired'")
    assert await scheduler.prune_events() == 2
    assert [e["kind"] for e in await store.schedules.schedule_events("s")] == [
        "schedule_created", "schedule_slots_skipped"]


async def test_a_schedule_with_no_slot_due_takes_no_lock(store, make_schedule, set_last_slot,
                                                         monkeypatch):
    """Between slots, passes are reads only: the turn (a transaction holding
    the row lock) is taken only when a slot may be due."""
    await make_schedule("daily", "0 0 * * *")
    turns = []
    real_turn = store.schedules.schedule_turn

    def counting_turn(schedule_id):
        turns.append(schedule_id)
        return real_turn(schedule_id)

    monkeypatch.setattr(store.schedules, "schedule_turn", counting_turn)
    scheduler = Scheduler(store, WORKFLOWS)
    for _ in range(3):
        assert (await scheduler.run_once()).admitted == []
    assert turns == []
    await set_last_slot("daily", "date_trunc('day', now()) - interval '1 second'")
    assert len((await scheduler.run_once()).admitted) == 1
    assert turns == ["daily"]
    await scheduler.run_once()
    assert turns == ["daily"]
