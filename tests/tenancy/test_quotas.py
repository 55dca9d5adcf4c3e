"""Issue 11 item 8: per-token quotas for admissions and signals.

Off unless configured for a token; over the quota a request is 429
`RATE_LIMITED` with `Retry-After` and nothing is stored; cheap — no lock on
the token's row and no statement per request (each API process counts in
memory and re-reads the limits in the background).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.api.quotas import Bucket, QuotaLimiter
from tests.support.admission import admit_api
from tests.support.responses import assert_error
from tests.support.waiting import wait_until
from tests.tenancy.conftest import headers

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


async def _admit(api, token, eid: str):
    return await admit_api(api, "wf", eid, headers=headers(token))


# ------------------------------------------------------------------ HTTP


async def test_admissions_over_the_quota_are_429_with_retry_after_and_store_nothing(
        api, tokens, store, pool) -> None:
    await store.tokens.set_token_quotas(tokens.a.token_id, admissions_per_minute=3)
    for i in range(3):
        assert (await _admit(api, tokens.a, f"qa-{i}")).status_code == 201
    r = await _admit(api, tokens.a, "qa-over")
    error = assert_error(r, 429, "RATE_LIMITED")
    assert "3 times per minute" in error["message"], error
    # A full bucket of 3 per minute refills one every 20 s.
    assert 1 <= int(r.headers["retry-after"]) <= 20, r.headers
    assert await pool.fetchval("SELECT count(*) FROM executions WHERE admitted_by = $1",
                               tokens.a.token_id) == 3
    assert not await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM executions WHERE execution_id = 'qa-over')")
    # Off unless configured: tenant B (no quota) is not limited, nor by A's use.
    for i in range(10):
        assert (await _admit(api, tokens.b, f"qb-{i}")).status_code == 201


async def test_signals_over_the_quota_are_429_and_store_nothing(api, tokens, store, pool,
                                                                admit_as) -> None:
    # Set before the API's first request: it reads the quotas then (later changes
    # apply within FENCEPOST_QUOTA_REFRESH_SECONDS, tested below).
    await store.tokens.set_token_quotas(tokens.a.token_id, signals_per_minute=2)
    eid = await admit_as(api, tokens.a, "sig-quota")
    for i in range(2):
        r = await api.post(f"/v1/executions/{eid}/signals/ping", json={"n": i},
                           headers=headers(tokens.a))
        assert r.status_code == 202, r.text
    r = await api.post(f"/v1/executions/{eid}/signals/ping", json={"n": 2},
                       headers=headers(tokens.a))
    assert_error(r, 429, "RATE_LIMITED")
    assert 1 <= int(r.headers["retry-after"]) <= 30, r.headers
    assert await pool.fetchval("SELECT count(*) FROM signals WHERE execution_id = $1", eid) == 2
    # The admission quota is separate (none set): admissions still go through.
    assert (await _admit(api, tokens.a, "sig-quota-2")).status_code == 201


async def test_a_quota_changed_on_a_live_token_applies_within_the_refresh(
        make_api, tenancy_settings, tokens, database_url) -> None:
    api = await make_api(tenancy_settings.model_copy(update={"quota_refresh_seconds": 0.2}))
    assert (await _admit(api, tokens.a, "live-0")).status_code == 201
    done = await tokens_cli(database_url, "quota", tokens.a.token_id,
                            "--admissions-per-minute", "1")
    assert done.returncode == 0, (done.stdout, done.stderr)
    n = 0

    async def limited() -> bool:
        nonlocal n
        n += 1
        return (await _admit(api, tokens.a, f"live-{n}")).status_code == 429

    await wait_until(limited, what="the new quota to apply", timeout=10,
                     interval=0.05)
    done = await tokens_cli(database_url, "quota", tokens.a.name, "--admissions-per-minute", "none")
    assert done.returncode == 0, (done.stdout, done.stderr)

    async def unlimited() -> bool:
        nonlocal n
        n += 1
        return (await _admit(api, tokens.a, f"live-{n}")).status_code == 201

    await wait_until(unlimited, what="the removed quota to stop applying", timeout=10,
                     interval=0.05)


async def test_a_shared_token_under_a_quota_takes_no_lock_on_its_row(
        make_api, tenancy_settings, tokens, store, pool) -> None:
    """The hot-row attack on a naive quota (UPDATE api_tokens SET used = used + 1):
    the token's row is held FOR UPDATE by another transaction while 32 clients
    sharing that token admit under a quota far above the load. Every admission
    must go through while the lock is held, and the limiter must have read the
    quotas once, not once per request."""
    await store.tokens.set_token_quotas(tokens.a.token_id, admissions_per_minute=1_000_000)
    api = await make_api(tenancy_settings.model_copy(update={"statement_timeout_seconds": 3}))
    assert (await _admit(api, tokens.a, "warm")).status_code == 201  # verifier cache, quotas read
    async with pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM api_tokens WHERE token_id = $1 FOR UPDATE",
                             tokens.a.token_id)
        try:
            answers = await asyncio.wait_for(asyncio.gather(*(
                _admit(api, tokens.a, f"shared-{c}-{i}") for c in range(32) for i in range(4)
            )), timeout=30)
        finally:
            await tx.rollback()
    assert [r.status_code for r in answers] == [201] * 128, {r.status_code for r in answers}
    assert api.app.state.quotas.refreshes == 1


# ------------------------------------------------------------------ CLI


async def tokens_cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "FENCEPOST_DATABASE_URL")}
    env["DATABASE_URL"] = database_url
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "app.cli", "tokens", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )


async def test_tokens_create_with_quotas_and_quota_shows_and_changes_them(database_url,
                                                                          pool) -> None:
    made = await tokens_cli(database_url, "create", "--role", "trigger", "--name", "shop",
                            "--admissions-per-minute", "600", "--signals-per-minute", "60")
    assert made.returncode == 0, (made.stdout, made.stderr)
    row = await pool.fetchrow("SELECT token_id, admissions_per_minute, signals_per_minute "
                              "FROM api_tokens WHERE name = 'shop'")
    assert (row["admissions_per_minute"], row["signals_per_minute"]) == (600, 60)

    shown = await tokens_cli(database_url, "quota", "shop")
    assert shown.returncode == 0, shown.stderr
    assert "600 admissions per minute" in shown.stdout and "60 signals per minute" in shown.stdout

    changed = await tokens_cli(database_url, "quota", row["token_id"], "--signals-per-minute", "off")
    assert changed.returncode == 0, changed.stderr
    row = await pool.fetchrow("SELECT admissions_per_minute, signals_per_minute FROM api_tokens "
                              "WHERE name = 'shop'")
    assert (row["admissions_per_minute"], row["signals_per_minute"]) == (600, None)
    assert "no limit on signals" in (await tokens_cli(database_url, "quota", "shop")).stdout

    plain = await tokens_cli(database_url, "create", "--role", "trigger", "--name", "free")
    assert plain.returncode == 0, plain.stderr
    assert await pool.fetchval("SELECT admissions_per_minute IS NULL AND signals_per_minute IS NULL "
                               "FROM api_tokens WHERE name = 'free'")


async def test_tokens_quota_usage_errors(database_url, pool) -> None:
    zero, negative, word, unknown, revoked_ok = await asyncio.gather(
        tokens_cli(database_url, "create", "--role", "trigger", "--name", "z",
                   "--admissions-per-minute", "0"),
        tokens_cli(database_url, "quota", "nobody", "--signals-per-minute", "-5"),
        tokens_cli(database_url, "create", "--role", "trigger", "--name", "w",
                   "--signals-per-minute", "none"),
        tokens_cli(database_url, "quota", "nobody", "--signals-per-minute", "5"),
        tokens_cli(database_url, "list"),
    )
    for done in (zero, negative, word):
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert "positive" in done.stderr, done.stderr
    assert unknown.returncode == 1 and "no live token" in unknown.stderr, unknown.stderr
    assert revoked_ok.returncode == 0
    assert await pool.fetchval("SELECT count(*) FROM api_tokens") == 0


# ------------------------------------------------------------------ the limiter itself


async def settled(condition) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the background refresh did not finish")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_bursts_a_minute_then_refills_at_the_rate() -> None:
    bucket = Bucket(capacity=3, rate=3 / 60, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(20.0)
    assert bucket.take(19.0) == pytest.approx(1.0)
    assert bucket.take(20.0) == 0.0  # the Retry-After it gave was honest
    assert bucket.take(20.0) == pytest.approx(20.0)


async def test_limiter_shares_the_quota_among_api_processes_and_refreshes_in_the_background(
) -> None:
    clock = Clock()
    reads = 0
    limits = {"t1": (120, None)}
    gate = asyncio.Event()

    async def load():
        nonlocal reads
        reads += 1
        await gate.wait()
        return dict(limits)

    quotas = QuotaLimiter(load, refresh_seconds=5, processes=2, clock=clock)
    # 32 concurrent first requests share one read of the quotas.
    first = [asyncio.ensure_future(quotas.check("t1", "admissions")) for _ in range(32)]
    await asyncio.sleep(0)
    gate.set()
    waits = await asyncio.gather(*first)
    assert reads == 1
    # 120 per minute over 2 processes: this one holds 60, refilled at 1 per second.
    assert waits.count(0.0) == 32
    assert [await quotas.check("t1", "admissions") for _ in range(28)] == [0.0] * 28
    assert await quotas.check("t1", "admissions") == pytest.approx(1.0)
    assert await quotas.check("t1", "signals") == 0.0  # no signal quota
    assert await quotas.check("other", "admissions") == 0.0  # no quota for that token
    assert await quotas.check(None, "admissions") == 0.0  # authentication disabled

    # Stale: the request that notices goes on with the old snapshot; a read starts.
    limits["t1"] = (None, 6)
    clock.now += 5
    gate.clear()
    assert await quotas.check("t1", "admissions") == 0.0  # old limit, refilled 5
    await settled(lambda: reads == 2)  # the read started, without holding the request
    assert [await quotas.check("t1", "admissions") for _ in range(4)] == [0.0] * 4
    assert await quotas.check("t1", "admissions") > 0  # still the old snapshot
    gate.set()
    await settled(lambda: quotas.refreshes == 2)
    # The admission quota is gone; the signal quota (6 / 2 processes = 3) applies.
    assert [await quotas.check("t1", "admissions") for _ in range(100)] == [0.0] * 100
    assert [await quotas.check("t1", "signals") for _ in range(3)] == [0.0] * 3
    assert await quotas.check("t1", "signals") == pytest.approx(20.0)
    assert reads == 2


async def test_limiter_keeps_its_snapshot_when_a_refresh_fails() -> None:
    clock = Clock()
    answers: list = [{"t1": (1, None)}, ConnectionError("database down")]

    async def load():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    quotas = QuotaLimiter(load, refresh_seconds=1, clock=clock)
    assert await quotas.check("t1", "admissions") == 0.0
    clock.now += 1
    assert await quotas.check("t1", "admissions") == pytest.approx(59.0)
    await settled(lambda: not answers and quotas._refresh.done())
    assert quotas.refreshes == 1
    assert await quotas.check("t1", "admissions") > 0  # still limited by the last snapshot
