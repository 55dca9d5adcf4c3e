"""Conflicts between concurrent transactions are retried inside the store.

A serialization failure (40001) or a deadlock (40P01) rolls back the whole
statement or transaction that met it: nothing it did stands, and the same
work run again usually succeeds. So the store retries it a bounded number of
times, with a short jittered backoff, in one place:

* `RetryingPool` wraps the asyncpg pool the store uses. Its single-statement
  calls (`execute`, `fetch`, `fetchrow`, `fetchval`, `executemany`) run in
  their own implicit transaction, so a statement that failed with 40001/40P01
  is simply sent again. Everything else (`acquire`, `close`, ...) is the
  pool's own, so `store.pool` stays a pool for tests and tools.
* `RetryingPool.run_in_transaction(fn)` runs `fn(conn)` inside one
  transaction and, on 40001/40P01, rolls back and runs the whole of `fn`
  again on a fresh transaction. `fn` must do nothing but database work (it
  may run more than once).

A conflict that outlasts the attempts is raised as it is: it is a
transaction-rollback error (SQLSTATE class 40), which app/dberrors.py
classifies as infrastructure, so the API answers 503 with Retry-After and a
worker treats it as the database failing, never as an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, cast

import asyncpg

from app.dberrors import is_retryable_conflict, sqlstate_of

log = logging.getLogger("fencepost.store")

T = TypeVar("T")
# A connection as the store uses it (a pool's connection is a proxy of one).
Connection = asyncpg.Connection
Isolation = Literal["read_committed", "read_uncommitted", "serializable", "repeatable_read"]

# 4 attempts, backoffs drawn from [0, 10 ms], [0, 20 ms], [0, 40 ms]: a
# conflict that persists for ~70 ms is no longer a race but a hot spot.
DEFAULT_ATTEMPTS = 4
BACKOFF_BASE_SECONDS = 0.01
BACKOFF_CAP_SECONDS = 0.2


def backoff_seconds(failed_attempts: int) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(n-1))]."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (failed_attempts - 1))
    return random.uniform(0, ceiling)


class RetryingPool:
    """An asyncpg pool whose single statements and `run_in_transaction`
    retry serialization failures and deadlocks (`attempts` tries in all)."""

    def __init__(self, pool: asyncpg.Pool, *, attempts: int = DEFAULT_ATTEMPTS):
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self._pool = pool
        self.attempts = attempts
        # Conflicts met and retried, by SQLSTATE (40001 / 40P01); and
        # conflicts that outlasted every attempt and were raised.
        self.retried: Counter[str] = Counter()
        self.exhausted: Counter[str] = Counter()

    @property
    def raw(self) -> asyncpg.Pool:
        return self._pool

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define: the pool's own.
        return getattr(self._pool, name)

    async def _retrying(self, what: str, run: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return await run()
            except Exception as exc:
                if not is_retryable_conflict(exc):
                    raise
                code = sqlstate_of(exc) or "40000"
                if attempt == self.attempts:
                    self.exhausted[code] += 1
                    log.warning("%s: %s persisted through %d attempts: %s", what, code,
                                attempt, exc)
                    raise
                self.retried[code] += 1
                log.info("%s: %s, retrying (attempt %d of %d)", what, code, attempt + 1,
                         self.attempts)
                await asyncio.sleep(backoff_seconds(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    # Keyword arguments (timeout=, column=, record_class=) pass through as given.

    async def execute(self, query: str, *args: Any, **kw: Any) -> str:
        return await self._retrying("statement", lambda: self._pool.execute(query, *args, **kw))

    async def executemany(self, command: str, args: Iterable[Sequence[Any]], **kw: Any) -> None:
        # One transaction for all the rows: retried as a whole.
        return await self._retrying(
            "statement", lambda: self._pool.executemany(command, args, **kw))

    async def fetch(self, query: str, *args: Any, **kw: Any) -> list[asyncpg.Record]:
        return await self._retrying("statement", lambda: self._pool.fetch(query, *args, **kw))

    async def fetchrow(self, query: str, *args: Any, **kw: Any) -> asyncpg.Record | None:
        return await self._retrying("statement", lambda: self._pool.fetchrow(query, *args, **kw))

    async def fetchval(self, query: str, *args: Any, **kw: Any) -> Any:
        return await self._retrying("statement", lambda: self._pool.fetchval(query, *args, **kw))

    async def run_in_transaction(self, fn: Callable[[Connection], Awaitable[T]], *,
                                 isolation: Isolation | None = None) -> T:
        """`await fn(conn)` inside one transaction on one connection; the whole
        transaction is run again (on a fresh transaction) after 40001/40P01."""

        async def once() -> T:
            async with self._pool.acquire() as proxy:
                conn = cast(Connection, proxy)
                if isolation is None:
                    async with conn.transaction():
                        return await fn(conn)
                async with conn.transaction(isolation=isolation):
                    return await fn(conn)

        return await self._retrying(getattr(fn, "__qualname__", "transaction"), once)


    @contextlib.asynccontextmanager
    async def connection(self, *, reset: bool = False) -> AsyncIterator[Connection]:
        """A connection of the pool for a unit of work of the caller's own
        (nothing retried); `reset`: its session state is reset before it
        goes back to the pool (the work may have run code that changed it)."""
        async with self._pool.acquire() as proxy:
            conn = cast(Connection, proxy)
            try:
                yield conn
            finally:
                if reset and not conn.is_closed():
                    await conn.reset()


def retrying(pool: asyncpg.Pool | RetryingPool) -> RetryingPool:
    """`pool` wrapped once (an already wrapped pool is returned as it is)."""
    return pool if isinstance(pool, RetryingPool) else RetryingPool(pool)
