"""A `fencepost api` told to stop (SIGTERM) while a long-poll waits (up to
60 s) answers it at once with the record as it is and exits well within its
5 s grace: the stop is not held up, and the client is not cut."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from app.serve import API_SHUTDOWN_SECONDS
from app.store import ExecutionStore
from tests.support.api_process import ApiProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_sigterm_with_a_long_poll_waiting_exits_within_the_grace(
        database_url, pool, tmp_path) -> None:
    await ExecutionStore(pool).admissions.admit(workflow_id="never-runs", params={}, execution_id="w-1")
    api = ApiProcess(database_url, tmp_path, env={"FENCEPOST_AUTH": "disabled"})
    try:
        await api.wait_ready()
        async with httpx.AsyncClient(base_url=api.base, timeout=90,
                                     headers={"host": "localhost"}) as client:
            waiting = asyncio.create_task(
                client.get("/v1/executions/w-1", params={"waitSeconds": 60}))
            # The long-poll is waiting: the API has recorded the execution it watches.
            await wait_until(lambda: pool.fetchval(
                "SELECT count(*) FROM watched_executions WHERE execution_id = 'w-1'"),
                timeout=10, what="the long-poll waiting")
            assert not waiting.done()
            api.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            code = await asyncio.to_thread(api.proc.wait, 30)
            took = time.monotonic() - started
            print(f"api exited {code} {took:.2f} s after SIGTERM with a long-poll waiting")
            assert took < API_SHUTDOWN_SECONDS, took
            answer = await asyncio.wait_for(waiting, 5)
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "admitted"
    finally:
        api.stop()
