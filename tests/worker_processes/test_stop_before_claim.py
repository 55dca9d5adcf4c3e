"""No claim begins after a stop signal reached the worker: before each claim
the claimer lets any pending signal's handler run (`let_pending_signals_run`),
then checks the stop. A signal reaches an event loop as a byte on its wakeup
socket, read at the loop's next I/O poll; the handler is then queued behind
the callbacks already ready, so a task that saw the signal land must yield
enough loop passes to run after it. Both loops the worker may run under are
checked, with the signal landing as the task runs from a ready callback and
as it runs from a timer (a due time, the claim batch's pause)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from app.worker import SIGNAL_PASSES, let_pending_signals_run

LOOPS: dict[str, Callable[[Coroutine[Any, Any, list[int]]], list[int]]] = {
    "asyncio": asyncio.run, "uvloop": uvloop.run}


async def passes_until_handled(woken_by: str, passes: int | None) -> list[int]:
    """Raise SIGUSR1 in this process, then yield: with `passes`, that many
    loop passes (0 or 1 if the handler ran by then, else -1); with None,
    `let_pending_signals_run()` (1 if the handler ran). Twenty tries."""
    loop = asyncio.get_running_loop()
    handled: list[int] = []
    loop.add_signal_handler(signal.SIGUSR1, handled.append, 1)
    seen = []
    try:
        for _ in range(20):
            handled.clear()
            if woken_by == "timer":
                await asyncio.sleep(0.001)
            # Delivered before kill() returns: the byte is on the wakeup socket.
            os.kill(os.getpid(), signal.SIGUSR1)
            if passes is None:
                await let_pending_signals_run()
            else:
                for _ in range(passes):
                    await asyncio.sleep(0)
            seen.append(1 if handled else -1)
            while not handled:  # let it run before the next try
                await asyncio.sleep(0)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
    return seen


@pytest.mark.parametrize("woken_by", ["ready", "timer"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_signal_that_landed_before_the_pre_claim_yield_is_handled_after_it(
        loop: str, woken_by: str) -> None:
    assert LOOPS[loop](passes_until_handled(woken_by, None)) == [1] * 20


@pytest.mark.parametrize("woken_by", ["ready", "timer"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_one_yield_fewer_would_leave_the_handler_behind_the_claim(
        loop: str, woken_by: str) -> None:
    # The other interleaving, forced: with a single yield (uvloop) or two
    # (asyncio) the handler has not run yet when the claimer would check.
    fewer = {"uvloop": 1, "asyncio": 2}[loop]
    assert fewer < SIGNAL_PASSES
    assert LOOPS[loop](passes_until_handled(woken_by, fewer)) == [-1] * 20
