"""ExecutionStore: every statement that touches fencepost's tables lives in
this package, one mixin per responsibility.

The API, the worker and the maintenance services call these methods and never
build SQL of their own. Rules the statements keep (DESIGN.md, RFC 001/002):

* The database clock is the only clock: every time is `now()` in SQL.
* A transition is conditional on the state it leaves; matching no row is a
  lost race, reported as an answer (`LeaseLost`, `ignored`), never guessed.
* Fenced writes (step write, acknowledge, renew, release) check the token and
  write in one statement, under the execution row's lock.
* Each transition appends its event in the same statement, so the history
  can never disagree with the record.
* A serialization failure or deadlock (40001/40P01) is retried here, a
  bounded number of times, never by callers: `self.pool` is a RetryingPool
  (app/store/retry.py) whose single statements retry, and a multi-statement
  transaction goes through `self.pool.run_in_transaction(fn)`.
"""


from __future__ import annotations

import asyncpg

from app.store.admission import AdmissionStatements
from app.store.bulk import BulkStatements
from app.store.clock import ClockStatements
from app.store.compose import ComposeStatements, TransactionFailed  # noqa: F401
from app.store.effects import EffectAttempt, EffectStatements  # noqa: F401
from app.store.leases import LeaseStatements
from app.store.operator import OperatorStatements
from app.store.policy import PolicyStatements
from app.store.redrive import Forked, Redriven, RedriveStatements  # noqa: F401
from app.store.retry import RetryingPool, retrying
from app.store.schedules import ScheduleStatements, ScheduleTurn  # noqa: F401
from app.store.sessions import SessionStatements
from app.store.shared import SharedSettingsStatements
from app.store.signals import SignalStatements
from app.store.steps import StepStatements
from app.store.tokens import TokenStatements
from app.store.types import *  # noqa: F403
from app.store.types import decode_cursor  # noqa: F401
from app.store.ui import UiStatements
from app.store.workers import WorkerStatements


class ExecutionStore(
    AdmissionStatements,
    LeaseStatements,
    PolicyStatements,
    StepStatements,
    EffectStatements,
    ComposeStatements,
    SignalStatements,
    OperatorStatements,
    RedriveStatements,
    BulkStatements,
    WorkerStatements,
    TokenStatements,
    UiStatements,
    ScheduleStatements,
    SessionStatements,
    SharedSettingsStatements,
    ClockStatements,
):
    pool: RetryingPool

    def __init__(
        self,
        pool: asyncpg.Pool | RetryingPool,
        *,
        redelivery_base_seconds: float = 1.0,
        redelivery_cap_seconds: float = 300.0,
        max_unacknowledged_deliveries: int = 25,
    ):
        self.pool = retrying(pool)
        self.redelivery_base = float(redelivery_base_seconds)
        self.redelivery_cap = float(redelivery_cap_seconds)
        self.max_unacknowledged = int(max_unacknowledged_deliveries)

    @classmethod
    def from_settings(cls, pool: asyncpg.Pool, settings) -> ExecutionStore:
        return cls(
            pool,
            redelivery_base_seconds=settings.redelivery_base_seconds,
            redelivery_cap_seconds=settings.redelivery_cap_seconds,
            max_unacknowledged_deliveries=settings.max_unacknowledged_deliveries,
        )

