"""GET /v1/executions/{id}?waitSeconds=N (issue 14 item 1): answered as soon as
the execution ends, else with its current record after N seconds; every
waiting request of a process shares one LISTEN connection outside the pool."""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from app.api.waiters import LISTENER_APPLICATION_NAME
from app.store.types import ENDED_CHANNEL
from tests.client.conftest import api_backends
from tests.support.waiting import wait_until


async def admit_many(store, n: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    for start in range(0, n, 100):
        await asyncio.gather(*(store.admissions.admit(workflow_id="never-runs", params={}, execution_id=eid)
                               for eid in ids[start:start + 100]))
    return ids


async def test_a_thousand_waiters_hold_a_handful_of_connections_and_all_return(
        make_server, client_settings, store, pg_admin, database_url):
    settings = client_settings.model_copy(update={"pool_max_size": 4})
    srv = await make_server(settings)
    ids = await admit_many(store, 1000, "lp")
    limits = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=srv.base, timeout=90, limits=limits) as http:
        calls = [asyncio.create_task(http.get(f"/v1/executions/{eid}",
                                              params={"waitSeconds": 60})) for eid in ids]

        async def all_waiting():
            return srv.app.state.waiters.count == 1000
        await wait_until(all_waiting, timeout=60, what="1000 waiters", interval=0.05)
        backends = await api_backends(pg_admin, database_url)
        # The pool (at most 4) and the one listening connection: not one per waiter.
        assert backends.get("fencepost-api", 0) <= 4, backends
        assert backends.get(LISTENER_APPLICATION_NAME) == 1, backends
        assert not any(c.done() for c in calls)

        started = time.monotonic()
        for start in range(0, 1000, 100):
            await asyncio.gather(*(store.operator.request_cancel(eid, "test") for eid in ids[start:start + 100]))
        answers = await asyncio.wait_for(asyncio.gather(*calls), 30)
        elapsed = time.monotonic() - started
    print(f"1000 waiters: backends while waiting {backends}; all answered {elapsed:.2f} s "
          "after the first cancel")
    assert [a.status_code for a in answers] == [200] * 1000
    assert {a.json()["status"] for a in answers} == {"cancelled"}
    assert srv.app.state.waiters.count == 0
    assert elapsed < 20, elapsed


async def test_a_waiter_on_an_execution_that_does_not_end_gets_its_record_after_n_seconds(
        server, store):
    await store.admissions.admit(workflow_id="never-runs", params={"n": 1}, execution_id="stays")
    async with server.client() as http:
        started = time.monotonic()
        answer = await http.get("/v1/executions/stays", params={"waitSeconds": 1.5})
        elapsed = time.monotonic() - started
    assert answer.status_code == 200
    assert answer.json()["status"] == "admitted"
    assert answer.json()["params"] == {"n": 1}
    assert 1.5 <= elapsed < 4, elapsed
    assert server.app.state.waiters.count == 0


async def test_a_terminal_execution_is_answered_at_once_and_a_missing_one_is_404(server, store):
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="done-already")
    await store.operator.request_cancel("done-already", "test")
    async with server.client() as http:
        started = time.monotonic()
        answer = await http.get("/v1/executions/done-already", params={"waitSeconds": 30})
        missing = await http.get("/v1/executions/nobody", params={"waitSeconds": 30})
        elapsed = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "EXECUTION_NOT_FOUND"
    assert elapsed < 2, elapsed


@pytest.mark.parametrize("value", ["-1", "61", "abc", "nan", "inf", ""])
async def test_wait_seconds_out_of_range_or_malformed_is_invalid_request(server, store, value):
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="x")
    async with server.client() as http:
        answer = await http.get(f"/v1/executions/x?waitSeconds={value}")
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    assert "waitSeconds" in answer.json()["error"]["message"]


async def test_a_notification_ends_the_wait_without_the_recheck(server, store, pool):
    server.app.state.waiters.recheck_seconds = 120  # only the notification can end it in time
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="notified")
    async with server.client() as http:
        call = asyncio.create_task(http.get("/v1/executions/notified",
                                            params={"waitSeconds": 60}))

        async def waiting():
            return server.app.state.waiters.count == 1
        await wait_until(waiting, timeout=20.0, what="the waiter", interval=0.05)
        started = time.monotonic()
        await store.operator.request_cancel("notified", "test")
        answer = await asyncio.wait_for(call, 10)
    assert answer.json()["status"] == "cancelled"
    assert time.monotonic() - started < 5


async def test_a_notification_alone_wakes_a_waiter_which_then_reads_the_record(
        server, store, pool):
    """The waiter's own part of the contract: a notice on ENDED_CHANNEL with the
    execution ID makes it re-read (here the record is unchanged: not ended,
    so it keeps answering with the current record)."""
    server.app.state.waiters.recheck_seconds = 120
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="poked")
    async with server.client() as http:
        call = asyncio.create_task(http.get("/v1/executions/poked", params={"waitSeconds": 60}))

        async def waiting():
            return server.app.state.waiters.count == 1
        await wait_until(waiting, timeout=20.0, what="the waiter", interval=0.05)
        started = time.monotonic()
        await pool.execute("SELECT pg_notify($1, 'poked')", ENDED_CHANNEL)
        answer = await asyncio.wait_for(call, 10)
    assert answer.json()["status"] == "admitted"
    assert time.monotonic() - started < 5


async def test_the_waiter_survives_its_listening_connection_dying(
        server, store, pg_admin, database_url):
    waiters = server.app.state.waiters
    waiters.recheck_seconds = 120  # only the listener (or its reconnect re-check) can end it

    async def listening():
        return waiters.connects >= 1
    await wait_until(listening, timeout=20.0, what="the listening connection", interval=0.05)
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="survivor")
    async with server.client() as http:
        call = asyncio.create_task(http.get("/v1/executions/survivor",
                                            params={"waitSeconds": 60}))

        async def waiting():
            return waiters.count == 1
        await wait_until(waiting, timeout=20.0, what="the waiter", interval=0.05)
        killed = await pg_admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1 AND datname = $2",
            LISTENER_APPLICATION_NAME, urlsplit(database_url).path.lstrip("/"))
        assert killed >= 1
        # Ended while the listener is down or reconnecting: its notice may be lost.
        await store.operator.request_cancel("survivor", "test")
        answer = await asyncio.wait_for(call, 20)
    assert answer.json()["status"] == "cancelled"
    assert waiters.connects >= 2
    backends = await api_backends(pg_admin, database_url)
    assert backends.get(LISTENER_APPLICATION_NAME) == 1, backends


async def test_a_client_that_disconnects_frees_its_waiter(server, store):
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="abandoned")
    waiters = server.app.state.waiters
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"GET /v1/executions/abandoned?waitSeconds=60 HTTP/1.1\r\n"
                 b"Host: 127.0.0.1\r\n\r\n")

    async def waiting():
        return waiters.count == 1
    await wait_until(waiting, timeout=20.0, what="the waiter", interval=0.05)
    sock.close()

    async def freed():
        return waiters.count == 0
    await wait_until(freed, timeout=5, what="the waiter to be freed", interval=0.05)


async def test_a_deadline_that_passes_ends_the_wait_without_any_write(server, store):
    """No process writes the end (no worker, no reaper): the record reads
    timed_out once its deadline passes, and the re-check finds it."""
    await store.admissions.admit(workflow_id="never-runs", params={}, execution_id="late",
                      timeout_seconds=1.0)
    async with server.client() as http:
        started = time.monotonic()
        answer = await http.get("/v1/executions/late", params={"waitSeconds": 30})
        elapsed = time.monotonic() - started
    assert answer.json()["status"] == "timed_out"
    assert elapsed < 5, elapsed
