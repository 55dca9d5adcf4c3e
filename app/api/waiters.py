"""Long-poll waiters (`GET /v1/executions/{id}?waitSeconds=N`): every request
of an API process waiting for an execution to end shares one LISTEN
connection (not from the request pool) and one slow re-check.

Invariants:
- A waiter registers before it reads the record, so an end committed after
  that read is either notified to it or seen by the next re-check.
- Every `recheck_seconds`, and at once after each (re)connect of the
  listening connection, one statement reads which waited-on executions are
  terminal: a notification lost (a reconnect) or never sent (a deadline that
  passed is terminal on read, before the reaper writes it) ends the wait
  within that interval.
- A waiter holds no database connection while it waits; it is removed when
  its request ends, whether answered, timed out or the client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator

import asyncpg
from starlette.types import Receive

from app.db import asyncpg_dsn
from app.settings import Settings
from app.store import ExecutionStore
from app.store.types import ENDED_CHANNEL

log = logging.getLogger("fencepost.api.waiters")

LISTENER_APPLICATION_NAME = "fencepost-api-waiters"


class Waiters:
    def __init__(self, settings: Settings, store: ExecutionStore, *,
                 recheck_seconds: float = 1.0) -> None:
        self.settings = settings
        self.store = store
        self.recheck_seconds = recheck_seconds
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._recheck_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._closing = False  # the process is stopping: nobody waits any more
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connects = 0  # listening connections opened so far (tests watch reconnects)

    @property
    def count(self) -> int:
        """Requests waiting now."""
        return sum(len(events) for events in self._waiting.values())

    def start(self) -> None:
        if not self.settings.database_url:  # the API's pool, created first, refuses too
            raise RuntimeError("DATABASE_URL is not set")
        dsn = asyncpg_dsn(self.settings.database_url)
        self.loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._listen(dsn), name="waiters: listen"),
                       asyncio.create_task(self._recheck(), name="waiters: re-check")]

    async def stop(self) -> None:
        """Stop both loops, bounded: a cancellation that lands while a
        wait_for inside asyncpg completes can be lost (Python 3.11), so the
        loops also check `_stopping`, and a task is cancelled again until it
        ends (at most ~5 s in all)."""
        self._stopping = True
        pending = set(self._tasks)
        for _ in range(10):
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        if pending:
            log.warning("waiters: %d loop(s) did not stop", len(pending))
        self._tasks = []

    @contextlib.contextmanager
    def watch(self, execution_id: str) -> Iterator[asyncio.Event]:
        """An event set when `execution_id` ends; registered for the block."""
        event = asyncio.Event()
        if self._closing:
            event.set()
        self._waiting.setdefault(execution_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._waiting.get(execution_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[execution_id]

    def release_all(self) -> None:
        """The process is stopping: every waiting request (and any later one)
        answers now, with the record as it is, instead of being cut."""
        self._closing = True
        for events in self._waiting.values():
            for event in events:
                event.set()

    def _ended(self, execution_id: str) -> None:
        for event in self._waiting.get(execution_id, ()):
            event.set()

    async def _listen(self, dsn: str) -> None:
        delay = 0.2
        while not self._stopping:
            conn = None
            try:
                conn = await asyncpg.connect(
                    dsn, timeout=self.settings.connect_timeout_seconds,
                    server_settings={"application_name": LISTENER_APPLICATION_NAME},
                )
                closed = asyncio.Event()
                conn.add_termination_listener(lambda *_, closed=closed: closed.set())
                await conn.add_listener(ENDED_CHANNEL,
                                        lambda _c, _pid, _ch, payload: self._ended(payload))
                self.connects += 1
                delay = 0.2
                self._recheck_now.set()  # ends missed while not listening
                while not self._stopping:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(5.0):
                            await closed.wait()
                    if closed.is_set():
                        raise ConnectionError("the LISTEN connection was closed")
                    await conn.execute("SELECT 1", timeout=5.0)  # a half-open socket shows here
            except Exception as exc:  # noqa: BLE001 - the listener must outlive any failure
                log.warning("waiters: listening connection lost (%s); reconnecting in %.2fs",
                            exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 5.0)
            finally:
                if conn is not None:
                    conn.terminate()

    async def _recheck(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.recheck_seconds):
                    await self._recheck_now.wait()
            self._recheck_now.clear()
            ids = list(self._waiting)
            if not ids:
                continue
            try:
                ended = await self.store.history.ended_among(ids)
            except Exception as exc:  # noqa: BLE001 - the re-check must outlive any failure
                log.warning("waiters: re-check failed (%s); trying again", exc)
                continue
            for execution_id in ended:
                self._ended(execution_id)


async def wait_or_gone(ended: asyncio.Event, seconds: float,
                       receive: Receive) -> bool:
    """Wait until `ended` is set or `seconds` pass (False when the client
    disconnected first: its request needs no answer)."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    end = asyncio.ensure_future(ended.wait())
    client_gone = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({end, client_gone}, timeout=seconds,
                           return_when=asyncio.FIRST_COMPLETED)
        return not client_gone.done()
    finally:
        end.cancel()
        client_gone.cancel()
