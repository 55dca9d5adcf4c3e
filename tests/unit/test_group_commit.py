"""The group-commit combiner on its own (no database): who is batched with
whom, and which answer reaches which caller. Its use on Postgres is tested
with the store objects that use it."""

from __future__ import annotations

import asyncio

import pytest

from app.store.group_commit import GroupCommit


class Recorder:
    """A flush that records each batch and holds it until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def flush(self, requests: list[int]) -> list[int | BaseException]:
        self.batches.append(list(requests))
        await self.release.wait()
        return [ValueError(f"bad {r}") if r < 0 else r * 10 for r in requests]


async def test_an_idle_writer_flushes_a_request_at_once_alone() -> None:
    rec = Recorder()
    writer: GroupCommit[int, int] = GroupCommit(rec.flush)
    assert await writer.submit(1) == 10
    assert await writer.submit(2) == 20
    assert rec.batches == [[1], [2]]


async def test_requests_arriving_during_a_flush_go_together_in_the_next() -> None:
    rec = Recorder()
    rec.release.clear()
    writer: GroupCommit[int, int] = GroupCommit(rec.flush, max_in_flight=1)
    first = asyncio.create_task(writer.submit(1))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(writer.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    assert rec.batches == [[1]]  # 2..4 wait for the flush in flight
    rec.release.set()
    assert await first == 10
    assert [await t for t in rest] == [20, 30, 40]
    assert rec.batches == [[1], [2, 3, 4]]


async def test_each_request_gets_its_own_answer_or_error() -> None:
    rec = Recorder()
    rec.release.clear()
    writer: GroupCommit[int, int] = GroupCommit(rec.flush, max_in_flight=1)
    hold = asyncio.create_task(writer.submit(0))
    await asyncio.sleep(0)
    good, bad = asyncio.create_task(writer.submit(5)), asyncio.create_task(writer.submit(-5))
    await asyncio.sleep(0)
    rec.release.set()
    await hold
    assert await good == 50
    with pytest.raises(ValueError, match="bad -5"):
        await bad
    assert rec.batches == [[0], [5, -5]]


async def test_a_failed_flush_is_every_requests_answer() -> None:
    calls: list[list[int]] = []

    async def broken(requests: list[int]) -> list[int]:
        calls.append(requests)
        raise ConnectionError("gone")

    writer: GroupCommit[int, int] = GroupCommit(broken, max_in_flight=1)
    tasks = [asyncio.create_task(writer.submit(n)) for n in (1, 2, 3)]
    for task in tasks:
        with pytest.raises(ConnectionError):
            await task
    assert calls == [[1], [2, 3]]


async def test_a_caller_that_gave_up_before_sending_is_left_out() -> None:
    rec = Recorder()
    rec.release.clear()
    writer: GroupCommit[int, int] = GroupCommit(rec.flush, max_in_flight=1)
    hold = asyncio.create_task(writer.submit(1))
    await asyncio.sleep(0)
    gone = asyncio.create_task(writer.submit(2))
    kept = asyncio.create_task(writer.submit(3))
    await asyncio.sleep(0)
    gone.cancel()
    rec.release.set()
    await hold
    assert await kept == 30
    assert rec.batches == [[1], [3]]


async def test_batches_are_capped_and_flushes_bounded() -> None:
    rec = Recorder()
    rec.release.clear()
    writer: GroupCommit[int, int] = GroupCommit(rec.flush, max_batch=2, max_in_flight=2)
    tasks = [asyncio.create_task(writer.submit(n)) for n in range(1, 7)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert rec.batches == [[1], [2]]  # two in flight, the rest wait
    rec.release.set()
    assert [await t for t in tasks] == [10, 20, 30, 40, 50, 60]
    assert sorted(len(b) for b in rec.batches) == [1, 1, 2, 2]


async def test_each_caller_of_a_failed_flush_gets_its_own_exception_object() -> None:
    # Raised in two tasks, one shared object would carry one caller's traceback
    # and context into the other's.
    class Gone(ConnectionError):
        sqlstate = "08006"

    release = asyncio.Event()
    batches: list[list[int]] = []

    async def broken(requests: list[int]) -> list[int]:
        batches.append(requests)
        await release.wait()
        raise Gone("gone")

    writer: GroupCommit[int, int] = GroupCommit(broken, max_in_flight=1)
    hold = asyncio.create_task(writer.submit(0))
    await asyncio.sleep(0)
    a, b = asyncio.create_task(writer.submit(1)), asyncio.create_task(writer.submit(2))
    await asyncio.sleep(0)
    release.set()
    errors = []
    for task in (hold, a, b):
        with pytest.raises(Gone) as raised:
            await task
        errors.append(raised.value)
    assert batches == [[0], [1, 2]]
    assert errors[1] is not errors[2]
    assert [(type(e), e.args, e.sqlstate) for e in errors[1:]] == [(Gone, ("gone",), "08006")] * 2
