"""Race tests that prove their interleavings happened.

Tools for the two ways a race test can show that each allowed interleaving
occurred (issue 10, item 15):

  Outcomes       count each round's outcome; `rounds()` runs at least the
                 given number of rounds and keeps going (up to a cap) until
                 every allowed outcome has been seen; `assert_each()` fails
                 naming the interleaving that never happened. An outcome not
                 in the allowed set fails at once.

  StatementGate  force one interleaving deterministically: a trigger (created
                 for the test, dropped after) makes the row change you name
                 wait for an advisory lock the test holds. The gated statement
                 stops *mid-flight*, holding every row lock it took before that
                 change, until `open()`. Most store statements write their event
                 row last, so gating `execution_events` on the statement's event
                 kind holds it with its `executions` row locked.

  RowLock        hold one `executions` row from a connection of its own, so
                 racers queue on it in the order they are started.

  lock_waiters   how many sessions of this database wait for a lock (of one
                 kind: "advisory" for a gated statement, "row" for a row lock);
                 until_waiting polls it (a timeout lists the sessions).
  (waiting itself: tests/support/waiting.py, never a fixed sleep.)
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator

import asyncpg

from tests.support.waiting import wait_until

# A step or timer write (app/store/steps.py) as pg_stat_activity shows it:
# its opening (the text there is cut at track_activity_query_size, 1 kB by
# default, before the tables a long statement names further down).
STEP_WRITE = "WITH input AS"
# pg_stat_activity.wait_event for a session blocked on another's row lock.
_ROW_LOCK_EVENTS = ("transactionid", "tuple")
_gate_ids = itertools.count(1)


async def lock_waiters(pool: asyncpg.Pool, kind: str = "any", query: str | None = None) -> int:
    """Sessions of this database waiting for a lock: kind "advisory" (a
    StatementGate), "row" (another transaction's row lock) or "any"; only
    those whose statement contains `query`, if given."""
    events: tuple[str, ...] | None = {
        "advisory": ("advisory",), "row": _ROW_LOCK_EVENTS, "any": None}[kind]
    return await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND ($1::text[] IS NULL OR wait_event = ANY($1::text[])) "
        "AND ($2::text IS NULL OR strpos(query, $2) > 0)",
        list(events) if events else None, query)


async def until_waiting(pool: asyncpg.Pool, n: int, kind: str = "any", *,
                        what: str, also: Callable[[], bool] | None = None,
                        query: str | None = None) -> None:
    """Wait until `n` sessions wait for a lock of `kind` (running a statement
    that contains `query`, if given), or `also()` is true (e.g. the task
    already finished: the caller then asserts on it)."""

    async def check() -> bool:
        return bool(also and also()) or await lock_waiters(pool, kind, query) >= n

    try:
        await wait_until(check, what=f"{n} session(s) waiting for a {kind} lock: {what}",
                         interval=0.005)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await activity(pool)}") from None


async def activity(pool: asyncpg.Pool) -> str:
    """This database's sessions, what they wait for and run (for failure messages)."""
    rows = await pool.fetch(
        "SELECT pid, state, wait_event_type, wait_event, left(query, 100) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    return "sessions:\n" + "\n".join(
        f"  {r['pid']} {r['state']} {r['wait_event_type']}/{r['wait_event']}: "
        f"{' '.join((r['query'] or '').split())}" for r in rows)


class Outcomes:
    """Per-outcome counts of a race repeated over rounds."""

    def __init__(self, *allowed: str):
        assert allowed and len(set(allowed)) == len(allowed), allowed
        self.allowed = allowed
        self.counts: Counter[str] = Counter()

    def add(self, outcome: str, where: str = "") -> str:
        assert outcome in self.allowed, f"{where}: outcome {outcome!r} is not one of {self.allowed}"
        self.counts[outcome] += 1
        return outcome

    @property
    def missing(self) -> list[str]:
        return [o for o in self.allowed if not self.counts[o]]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def rounds(self, minimum: int, maximum: int | None = None) -> Iterator[int]:
        """Round numbers: at least `minimum`, then more while an allowed
        outcome has not occurred yet, up to `maximum` (default 3 x minimum)."""
        cap = 3 * minimum if maximum is None else maximum
        for i in itertools.count():
            if i >= cap or (i >= minimum and not self.missing):
                return
            yield i

    def summary(self) -> str:
        return ", ".join(f"{o}: {self.counts[o]}" for o in self.allowed)

    def assert_each(self, what: str, unit: str = "rounds") -> Counter[str]:
        """Every allowed outcome occurred at least once."""
        print(f"\n{what}, {self.total} {unit}: {self.summary()}")
        assert not self.missing, (
            f"{what}: over {self.total} {unit} the interleaving(s) {self.missing} never "
            f"happened ({self.summary()})")
        return self.counts


class StatementGate:
    """Hold statements mid-flight at one row change until `open()`.

        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'claimed' AND NEW.execution_id = 'x'") as gate:
            claim = asyncio.create_task(store.leases.claim_due(...))
            await gate.until_held()        # the claim has locked 'x' and waits here
            ...                            # race something against the held claim
            await gate.open()

    `when` is the trigger's WHEN condition over NEW (INSERT/UPDATE) rows of
    `table`; `events` the trigger events. The trigger and its function are
    dropped on exit (the gate is opened first if still closed)."""

    def __init__(self, pool: asyncpg.Pool, table: str, when: str, *,
                 events: str = "INSERT"):
        self.pool = pool
        self.table = table
        self.when = when
        self.events = events
        n = next(_gate_ids)
        self.name = f"fp_test_gate_{n}"
        self.key = 7_150_000 + n
        self._holder: asyncpg.pool.PoolConnectionProxy | None = None

    async def __aenter__(self) -> StatementGate:
        self._holder = await self.pool.acquire()
        await self._holder.execute("SELECT pg_advisory_lock($1)", self.key)
        await self.pool.execute(
            f"""
            CREATE FUNCTION {self.name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock({self.key}); RETURN NEW; END $$;
            CREATE TRIGGER {self.name} BEFORE {self.events} ON {self.table}
                FOR EACH ROW WHEN ({self.when}) EXECUTE FUNCTION {self.name}();
            """)
        return self

    async def until_held(self, n: int = 1, *, also: Callable[[], bool] | None = None) -> None:
        """Wait until `n` statements wait at this gate."""

        async def check() -> bool:
            if also and also():
                return True
            return await self.pool.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = $1 AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                self.key) >= n

        try:
            await wait_until(check, what=f"{n} statement(s) held at {self.name} ({self.when})",
                             interval=0.005)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{await activity(self.pool)}") from None

    async def open(self) -> None:
        if self._holder is not None:
            await self._holder.execute("SELECT pg_advisory_unlock($1)", self.key)
            await self.pool.release(self._holder)
            self._holder = None

    async def __aexit__(self, *exc: object) -> None:
        await self.open()
        await self.pool.execute(
            f"DROP TRIGGER IF EXISTS {self.name} ON {self.table}; "
            f"DROP FUNCTION IF EXISTS {self.name}()")


class RowLock:
    """Hold `FOR UPDATE` (or `FOR SHARE`) on one `executions` row from a
    connection of its own until `release()`: statements that need the row
    queue behind it, and Postgres hands the row to them in the order they
    arrived (the first waiter holds the tuple lock), so starting racers one
    by one with `until_waiting` between them fixes their order."""

    def __init__(self, pool: asyncpg.Pool, execution_id: str, mode: str = "UPDATE"):
        assert mode in ("UPDATE", "SHARE"), mode
        self.pool = pool
        self.execution_id = execution_id
        self.mode = mode
        self._conn: asyncpg.pool.PoolConnectionProxy | None = None
        self._tx: asyncpg.transaction.Transaction | None = None

    async def __aenter__(self) -> RowLock:
        self._conn = await self.pool.acquire()
        self._tx = self._conn.transaction()
        await self._tx.start()
        found = await self._conn.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM executions WHERE execution_id = $1 "
            f"FOR {self.mode}) x", self.execution_id)
        assert found == 1, f"no execution {self.execution_id!r} to lock"
        return self

    async def release(self) -> None:
        if self._conn is not None:
            assert self._tx is not None
            await self._tx.commit()
            await self.pool.release(self._conn)
            self._conn = self._tx = None

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
