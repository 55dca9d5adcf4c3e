"""ExecutionStore: every statement that touches fencepost's tables lives in
this package, in a few objects named after what they are responsible for:

    store.admissions   admission (admission.py)
    store.leases       claim, renew, release, acknowledge, reap, sweep (leases.py;
                       the fence every holder's write passes: fencing.py)
    store.steps        fenced step writes, timers, attempts, late observations (steps.py)
    store.effects      external calls: begin, retry, park as outcome unknown (effects.py)
    store.compose      transactional steps and child workflows (compose.py)
    store.signals      signals sent from outside, consumed by a fenced step (signals.py)
    store.operator     cancel, terminate, resolve, resume, wake (operator.py)
    store.redrives     redrive and fork (redrive.py)
    store.operations   bulk operations (bulk.py)
    store.history      reads: records, pages, events, steps; retention (history.py)
    store.dashboard    the dashboard's listing, counts and activity (ui.py)
    store.maintenance  which worker runs each maintenance role (leadership.py)
    store.schedules, store.workers, store.tokens, store.sessions,
    store.settings (shared settings), store.clock (the database clock)

Rows a read returns are records (records.py): plain dicts keyed by the
columns' snake_case names, typed as TypedDicts (camelCase is the API's,
never the store's); claims, leases and fenced writes answer with the frozen
dataclasses of types.py.

Each object runs its statements through one handle (app/store/handle.py):
the retrying pool, or a connection in a caller's transaction. `store.transaction()`
yields the same objects bound to one connection, so their statements commit
or roll back together. Rules the statements keep:

* The database clock is the only clock: every time is `now()` in SQL.
* A transition is conditional on the state it leaves; matching no row is a
  lost race, reported as an answer (`LeaseLost`, `ignored`), never guessed.
* Fenced writes check the token and write in one statement, under the
  execution row's lock; a refused one is recorded (fencing.py).
* Each transition appends its event in the same statement, so the history
  can never disagree with the record.
* A serialization failure or deadlock (40001/40P01) is retried here, a
  bounded number of times, never by callers: on the pool, single statements
  retry and a multi-statement transaction runs again as a whole
  (app/store/retry.py); in a caller's transaction, its owner retries.
"""


from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from app.store.admission import Admissions, Existing
from app.store.bulk import Operations
from app.store.clock import Clock
from app.store.compose import ChildExecution, Compose, TransactionFailed
from app.store.effects import EffectAttempt, Effects
from app.store.exports import Exports
from app.store.handle import ConnectionHandle, Handle, StoreConfig
from app.store.history import History
from app.store.leadership import MaintenanceLease, MaintenanceLeases
from app.store.leases import Leases
from app.store.operator import Operator
from app.store.queues import Queues
from app.store.redrive import Forked, Redriven, Redrives
from app.store.retry import RetryingPool, retrying
from app.store.schedules import Schedules, ScheduleTurn
from app.store.sessions import Sessions
from app.store.shared import SettingChange, SharedSettings, StoredSetting
from app.store.signals import Signals, SignalSender
from app.store.steps import Steps
from app.store.tokens import Tokens
from app.store.types import (
    ENDED_CHANNEL,
    NOTIFY_CHANNEL,
    Acknowledged,
    Admitted,
    Conflict,
    Delivery,
    Interrupt,
    InvalidEvent,
    Lease,
    LeaseLost,
    ReapResult,
    StepRecord,
    WakeAnswer,
    decode_cursor,
)
from app.store.ui import Dashboard
from app.store.versions import Versions
from app.store.workers import Workers

__all__ = [
    "ENDED_CHANNEL", "NOTIFY_CHANNEL", "Acknowledged", "Admissions", "Admitted", "ChildExecution",
    "Clock", "Compose", "Conflict", "ConnectionHandle", "Dashboard", "Delivery", "EffectAttempt",
    "Effects", "ExecutionStore", "Existing", "Forked", "Handle", "History", "Interrupt",
    "InvalidEvent", "Lease", "LeaseLost", "Leases", "MaintenanceLease", "MaintenanceLeases",
    "Operations", "Operator", "Queues", "ReapResult",
    "Redriven", "Redrives", "RetryingPool", "ScheduleTurn", "Schedules", "Sessions",
    "SettingChange", "SharedSettings", "SignalSender", "Signals", "StepRecord", "Steps",
    "StoreConfig", "StoreObjects", "StoredSetting", "Tokens", "TransactionFailed", "WakeAnswer",
    "Workers", "decode_cursor",
]

T = TypeVar("T")


class StoreObjects:
    """Every store object, bound to one handle."""

    def __init__(self, db: Handle, config: StoreConfig) -> None:
        self.config = config
        self.admissions = Admissions(db, config)
        self.leases = Leases(db, config)
        self.steps = Steps(db, config)
        self.effects = Effects(db, config)
        self.compose = Compose(db, config)
        self.signals = Signals(db, config)
        self.operator = Operator(db, config)
        self.redrives = Redrives(db, config)
        self.operations = Operations(db, config)
        self.history = History(db, config)
        self.dashboard = Dashboard(db, config)
        self.schedules = Schedules(db, config)
        self.workers = Workers(db, config)
        self.tokens = Tokens(db, config)
        self.sessions = Sessions(db, config)
        self.settings = SharedSettings(db, config)
        self.clock = Clock(db, config)
        self.maintenance = MaintenanceLeases(db, config)
        self.queues = Queues(db, config)
        self.versions = Versions(db, config)
        self.exports = Exports(db, config)


class ExecutionStore(StoreObjects):
    """The store objects on the (retrying) pool, and `transaction()` for
    running several of them in one transaction."""

    pool: RetryingPool

    def __init__(
        self,
        pool: asyncpg.Pool | RetryingPool,
        *,
        redelivery_base_seconds: float = 1.0,
        redelivery_cap_seconds: float = 300.0,
        max_unacknowledged_deliveries: int = 25,
        claim_recheck_seconds: float = 1.0,
    ) -> None:
        self.pool = retrying(pool)
        super().__init__(self.pool, StoreConfig(
            redelivery_base=float(redelivery_base_seconds),
            redelivery_cap=float(redelivery_cap_seconds),
            max_unacknowledged=int(max_unacknowledged_deliveries),
            claim_recheck=float(claim_recheck_seconds),
        ))

    @classmethod
    def from_settings(cls, pool: asyncpg.Pool | RetryingPool, settings: Any) -> ExecutionStore:
        return cls(
            pool,
            redelivery_base_seconds=settings.redelivery_base_seconds,
            redelivery_cap_seconds=settings.redelivery_cap_seconds,
            max_unacknowledged_deliveries=settings.max_unacknowledged_deliveries,
            claim_recheck_seconds=settings.claim_recheck_seconds,
        )

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[StoreObjects]:
        """The store objects bound to one connection in one transaction: it
        commits when the block ends, and rolls back (all of it) on an
        exception. Not retried: a 40001/40P01 is raised to the caller (use
        `run_in_transaction` for work that may simply run again)."""
        async with self.pool.connection() as conn, conn.transaction():
            yield StoreObjects(ConnectionHandle(conn), self.config)

    async def run_in_transaction(self, fn: Callable[[StoreObjects], Awaitable[T]]) -> T:
        """`fn(objects)` with the objects bound to one transaction, run again
        as a whole after a serialization failure or deadlock; `fn` must do
        nothing but database work (it may run more than once)."""
        return await self.pool.run_in_transaction(
            lambda conn: fn(StoreObjects(ConnectionHandle(conn), self.config)))
