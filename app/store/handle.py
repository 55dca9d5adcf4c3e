"""The one handle every store object runs its statements through: the pool,
or a connection inside a caller's transaction.

* `RetryingPool` (app/store/retry.py) is the pool's handle: each single
  statement runs in its own implicit transaction and is sent again after a
  serialization failure or deadlock (40001/40P01); `run_in_transaction(fn)`
  runs `fn(conn)` in one transaction and runs the whole of it again after one.
* `ConnectionHandle` is a connection in a transaction its caller owns: its
  statements join that transaction, and `run_in_transaction(fn)` runs `fn`
  in a savepoint (rolled back alone if `fn` raises). It never retries: a
  40001/40P01 aborts the whole outer transaction, so only its owner can run
  it again.

So several store objects bound to one ConnectionHandle commit, or roll back,
together (`ExecutionStore.transaction()`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import asyncpg

from app.store.retry import Connection, Isolation

T = TypeVar("T")


class Handle(Protocol):
    """What a store object needs from where its statements run."""

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str: ...

    async def fetch(self, query: str, *args: Any,
                    timeout: float | None = None) -> list[asyncpg.Record]: ...

    async def fetchrow(self, query: str, *args: Any,
                       timeout: float | None = None) -> asyncpg.Record | None: ...

    async def fetchval(self, query: str, *args: Any, column: int = 0,
                       timeout: float | None = None) -> Any: ...

    async def run_in_transaction(self, fn: Callable[[Connection], Awaitable[T]], *,
                                 isolation: Isolation | None = None) -> T: ...

    def connection(self, *, reset: bool = False
                   ) -> contextlib.AbstractAsyncContextManager[Connection]: ...


class ConnectionHandle:
    """A connection whose transaction belongs to the caller (see above)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        return await self.conn.execute(query, *args, timeout=timeout)

    async def fetch(self, query: str, *args: Any,
                    timeout: float | None = None) -> list[asyncpg.Record]:
        return await self.conn.fetch(query, *args, timeout=timeout)

    async def fetchrow(self, query: str, *args: Any,
                       timeout: float | None = None) -> asyncpg.Record | None:
        return await self.conn.fetchrow(query, *args, timeout=timeout)

    async def fetchval(self, query: str, *args: Any, column: int = 0,
                       timeout: float | None = None) -> Any:
        return await self.conn.fetchval(query, *args, column=column, timeout=timeout)

    async def run_in_transaction(self, fn: Callable[[Connection], Awaitable[T]], *,
                                 isolation: Isolation | None = None) -> T:
        """`fn(conn)` in a savepoint of the caller's transaction (a new
        transaction if there is none). `isolation` is the outer
        transaction's to choose; it cannot change inside it."""
        if isolation is not None and not self.conn.is_in_transaction():
            async with self.conn.transaction(isolation=isolation):
                return await fn(self.conn)
        async with self.conn.transaction():
            return await fn(self.conn)

    @contextlib.asynccontextmanager
    async def connection(self, *, reset: bool = False) -> AsyncIterator[Connection]:
        """The caller's connection itself (never reset: its session is the caller's)."""
        yield self.conn


@dataclass
class PlacementCache:
    """What a store learns once and shares with its transactions' store
    objects: where the buckets live (app/store/placement.py), and the queues
    known to exist (queues are never deleted)."""

    placement: Any = None
    queues: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class StoreConfig:
    """The settings statements read (every process agrees on them: they are
    shared settings): the redelivery delay's base and cap, and the poison
    threshold (unacknowledged deliveries in a row that park an execution).
    `placement`: where the buckets live, read at first need."""

    redelivery_base: float = 1.0
    redelivery_cap: float = 300.0
    max_unacknowledged: int = 25
    # Citus: how long a claimer skips a shard group that had nothing due
    # (ClaimRotation); a per-process setting, not a shared one.
    claim_recheck: float = 1.0
    placement: PlacementCache = field(default_factory=PlacementCache, compare=False)


class StoreObject:
    """A store object: its statements run through `db` and read `config`."""

    def __init__(self, db: Handle, config: StoreConfig) -> None:
        self.db = db
        self.config = config
