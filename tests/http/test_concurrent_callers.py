"""Concurrent callers never see a 500 (issue 10, item 1).

A real `fencepost api` process and two real `fencepost worker` processes on
the test database; 24 clients signal one waiting execution at once, for
several rounds. Every signal must be answered 202 and stored, and the
workflow (wait_for_signal in a loop, one step key per signal) must consume
them all, in the order they were stored (signal_id order).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from app.shared_settings import SHARED
from tests.http.conftest import api_settings
from tests.support.api_process import ApiProcess
from tests.support.harness import DEFAULT_SETTINGS, Harness
from tests.support.races import RowLock

FLOWS = "tests.http.concurrent_flows"
CLIENTS = 24
ROUNDS = 8


class ConcurrencyHarness(Harness):
    flows_module = FLOWS
    worker_prefix = "cc-worker"


@pytest_asyncio.fixture
async def service(database_url, tmp_path) -> AsyncIterator[tuple[ConcurrencyHarness, ApiProcess]]:
    h = await ConcurrencyHarness(database_url, tmp_path).open()
    # Shared settings are the workers' (a process with others refuses to start).
    api = ApiProcess(database_url, h.log_dir,
                     env={"FENCEPOST_AUTH": "disabled",
                          **{k: v for k, v in DEFAULT_SETTINGS.items() if k in SHARED.values()}},
                     args=("--workflows", FLOWS))
    ok = False
    try:
        await api.wait_ready()
        for name in ("A", "B"):
            await h.start_worker(name, concurrency=4)
        yield h, api
        ok = True
    finally:
        api.stop()
        await h.close()
        if not ok:
            print(h.logs())
            print("===== api =====\n" + api.log_path.read_text(errors="replace"))


async def test_24_clients_signalling_one_execution_at_once_all_get_202_in_order(service):
    h, api = service
    eids = [f"cc-signals-{r}" for r in range(ROUNDS)]
    statuses: Counter = Counter()
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=api.base, timeout=30,
                                 limits=httpx.Limits(max_connections=CLIENTS * 2)) as c:
        for eid in eids:
            r = await c.post("/v1/executions", json={"workflowId": "concurrent-signals",
                                                     "executionId": eid,
                                                     "params": {"n": CLIENTS}})
            assert r.status_code == 201, r.text
        for eid in eids:
            await h.wait_for(lambda eid=eid: h.has_status(eid, "suspended"), timeout=20,
                             what=f"{eid} waiting for its first signal")

        latencies: list[float] = []

        async def send(eid: str, i: int) -> None:
            started = time.perf_counter()
            try:
                r = await c.post(f"/v1/executions/{eid}/signals/go", json={"eid": eid, "i": i})
                latencies.append(time.perf_counter() - started)
            except httpx.TransportError as exc:  # hung past the client timeout, or dropped
                statuses[type(exc).__name__] += 1
                failures.append(f"{eid}#{i}: {exc!r}")
                return
            statuses[r.status_code] += 1
            if r.status_code != 202:
                failures.append(f"{eid}#{i}: {r.status_code} {r.text[:200]}")

        for eid in eids:
            await asyncio.gather(*(send(eid, i) for i in range(CLIENTS)))

    print(f"answers: {dict(statuses)}; slowest answer {max(latencies, default=0) * 1000:.0f} ms")
    assert not failures, (dict(statuses), failures[:10])
    assert statuses == Counter({202: CLIENTS * ROUNDS})

    await h.wait_for(lambda: h.all_terminal(eids), timeout=120, what="every round consumed")
    during_delivery = while_waiting = 0
    for eid in eids:
        rec = await h.record(eid)
        assert rec["status"] == "completed", rec
        stored = await h.pool.fetch(
            "SELECT payload, consumed_step FROM signals WHERE execution_id = $1 "
            "ORDER BY signal_id", eid)
        assert len(stored) == CLIENTS
        assert sorted(s["payload"]["i"] for s in stored) == list(range(CLIENTS))
        # Consumed in arrival order: the i-th stored signal is the i-th consumed.
        assert [s["payload"] for s in stored] == rec["outcome"]["result"]
        assert [s["consumed_step"] for s in stored] == [f"go-{i}" for i in range(CLIENTS)]
        # Which interleaving each signal met: stored while a delivery held the
        # execution (between `claimed` and its end) or while it was waiting.
        held = False
        for ev in await h.events(eid):
            if ev["kind"] == "claimed":
                held = True
            elif ev["kind"] in ("acknowledged", "released", "lease_expired"):
                held = False
            elif ev["kind"] == "signal_received":
                if held:
                    during_delivery += 1
                else:
                    while_waiting += 1
    print(f"signals stored during a delivery: {during_delivery}, while waiting: {while_waiting}")
    assert during_delivery + while_waiting == CLIENTS * ROUNDS
    assert during_delivery > 0 and while_waiting > 0


MIXED_ROUNDS = 8


async def test_mixed_concurrent_callers_on_one_execution_never_see_a_500(client, store, pool):
    """Signals, wakes, reads and one cancel, all at once on one execution,
    through the app with its real pool (statements run concurrently in
    Postgres). Every answer is the documented one; a signal is stored if and
    only if it was answered 202, and none is stored after the cancel."""
    stored_before_cancel = refused_after_cancel = 0
    for rnd in range(MIXED_ROUNDS):
        eid = f"mixed-{rnd}"
        await store.admissions.admit(workflow_id="wf", params={}, execution_id=eid)
        path = f"/v1/executions/{eid}"
        requests = [("POST", f"{path}/signals/go", {"json": {"i": i}}) for i in range(12)]
        requests += [("POST", f"{path}/wakes", {})] * 6
        requests += [("GET", path, {}), ("GET", f"{path}/events", {}),
                     ("GET", f"{path}/steps", {})]
        # The cancel goes at a different place in each round's burst.
        requests.insert(2 * rnd, ("POST", f"{path}/cancel", {}))
        answers = await asyncio.gather(*(client.request(m, p, **kw) for m, p, kw in requests))
        signals_ok = 0
        for (method, p, _), r in zip(requests, answers, strict=True):
            assert r.status_code < 500, (method, p, r.status_code, r.text)
            if p.endswith("/signals/go"):
                assert r.status_code in (202, 409), (r.status_code, r.text)
                if r.status_code == 202:
                    signals_ok += 1
                else:
                    assert r.json()["error"]["code"] == "EXECUTION_TERMINAL"
                    refused_after_cancel += 1
            elif p.endswith("/cancel"):
                assert r.status_code == 202, r.text
            elif p.endswith("/wakes"):
                assert r.status_code in (200, 202), r.text
            else:
                assert r.status_code == 200, r.text
        stored_before_cancel += signals_ok
        assert await pool.fetchval("SELECT count(*) FROM signals WHERE execution_id = $1",
                                   eid) == signals_ok
        kinds = [e["kind"] for e in await store.history.events(eid)]
        assert kinds.count("signal_received") == signals_ok
        assert "signal_received" not in kinds[kinds.index("cancelled"):]
    print(f"signals stored before the cancel: {stored_before_cancel}, "
          f"refused after it: {refused_after_cancel}")
    assert stored_before_cancel > 0 and refused_after_cancel > 0


async def test_a_caller_behind_a_row_lock_held_past_the_statement_timeout_gets_503(
        settings, store, pool, make_client):
    """A long transactional step holds its execution's row FOR SHARE for its
    whole transaction; a signal (which needs the row) waits for it, and past
    the statement timeout answers 503 with Retry-After, storing nothing. Once
    the row is free the same signal is 202."""
    await store.admissions.admit(workflow_id="wf", params={}, execution_id="held")
    client = await make_client(api_settings(settings, statement_timeout_seconds=0.5),
                               raise_app_exceptions=False)
    async with RowLock(pool, "held", mode="SHARE"):
        started = time.perf_counter()
        r = await client.post("/v1/executions/held/signals/go", json={"n": 1})
        elapsed = time.perf_counter() - started
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "DATABASE_UNAVAILABLE"
        assert int(r.headers["retry-after"]) > 0
        assert elapsed < 3, elapsed
    assert await pool.fetchval("SELECT count(*) FROM signals") == 0
    r = await client.post("/v1/executions/held/signals/go", json={"n": 1})
    assert r.status_code == 202, r.text
    assert await pool.fetchval("SELECT count(*) FROM signals") == 1
