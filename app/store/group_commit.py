"""Group commit: concurrent requests of one kind, combined into one statement.

A store object that writes the same kind of row for many callers at once (a
worker's deliveries recording steps, an API process admitting executions)
submits each caller's request here; `flush(requests)` writes a whole batch in
one statement and answers each request on its own. The rules:

* An idle writer adds no latency: a request that finds fewer than
  `max_in_flight` flushes running is flushed at once, alone.
* A busy writer batches: requests arriving while the flushes are in flight
  wait for the next one, which takes everything waiting (up to `max_batch`).
  The window is the duration of the statement before: it adapts by itself.
* Every request gets its own answer: `flush` returns one answer per request,
  in order, each a value or an exception for that request alone. An
  exception `flush` raises is every request's answer (the statement did not
  commit, for any of them).
* A caller that stops waiting (its task was cancelled) before its request was
  sent is left out of the batch; once sent, its row commits or not with the
  rest, and only the answer is dropped. Requests are never sent twice.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Req = TypeVar("Req")
Ans = TypeVar("Ans")


class GroupCommit(Generic[Req, Ans]):
    def __init__(self, flush: Callable[[list[Req]], Awaitable[Sequence[Ans | BaseException]]], *, max_batch: int = 256, max_in_flight: int = 2) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._waiting: list[tuple[Req, asyncio.Future[Ans]]] = []
        self._in_flight = 0
        # The flushes running: held here, since the loop keeps only a weak
        # reference to a task and an unreferenced flush could be collected.
        self._flushes: set[asyncio.Task[None]] = set()
        # Batch sizes flushed so far (how much combining happened), for the bench.
        self.batches = 0
        self.requests = 0

    async def submit(self, request: Req) -> Ans:
        future: asyncio.Future[Ans] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        self._start()
        return await future

    def _start(self) -> None:
        while self._waiting and self._in_flight < self._max_in_flight:
            batch = self._waiting[:self._max_batch]
            del self._waiting[:self._max_batch]
            # A caller that gave up before its request was sent: not sent at all.
            batch = [(r, f) for r, f in batch if not f.done()]
            if not batch:
                continue
            self._in_flight += 1
            self.batches += 1
            self.requests += len(batch)
            flush = asyncio.get_running_loop().create_task(self._run(batch))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)

    async def _run(self, batch: list[tuple[Req, asyncio.Future[Ans]]]) -> None:
        try:
            try:
                answers = await self._flush([r for r, _ in batch])
            except asyncio.CancelledError:  # the writer's loop is ending
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # every request's answer: nothing committed
                for _, future in batch:
                    if not future.done():
                        future.set_exception(own_copy(exc))
                return
            if len(answers) != len(batch):  # a defect in flush: say so to every caller
                mismatch = RuntimeError(
                    f"group commit: {len(answers)} answers for {len(batch)} requests")
                answers = [mismatch] * len(batch)
            settle([future for _, future in batch], answers)
        finally:
            self._in_flight -= 1
            self._start()


def settle(futures: Sequence[asyncio.Future[Ans]],
           answers: Sequence[Ans | BaseException]) -> None:
    """Each waiting caller its own answer: a value, or an exception for it
    alone. A caller that stopped waiting is skipped: its row's fate is the
    statement's, and only the answer is dropped."""
    for future, answer in zip(futures, answers, strict=True):
        if future.done():
            continue
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)


def own_copy(exc: Exception) -> Exception:
    """One caller's copy of an error every caller of a batch receives: raised
    in several tasks, one shared object would carry each caller's traceback
    and context into the others'. Type, args and attributes (a SQLSTATE) stay."""
    try:
        return copy.copy(exc)
    except Exception:  # an exception that cannot be copied is shared as it is
        return exc
