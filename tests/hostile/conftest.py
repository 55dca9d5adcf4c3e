"""Fixtures for the hostile-input tests: the real app (create_app, auth
enabled, its lifespan and pool) on the per-test migrated database, with
tokens of every role and executions in the states the operations act on.

  live            Live(app, settings, tokens, seeded): the app is built but not
                  started; schemathesis (test_schemathesis.py) starts its lifespan
                  on its own event-loop thread, and the test stops it after
  seed(pool, s)   executions in every state an operation acts on (Seeded)
  make_tokens     one token per role
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import pytest_asyncio

from app.api.app import create_app
from app.api.auth import new_token
from app.settings import Settings
from app.store import ExecutionStore
from tests.support.admission import admitting


@dataclass(frozen=True)
class Seeded:
    pending: str  # admitted, due, nobody holds it
    completed: str  # terminal
    running: str  # held under a live lease
    poison: str  # parked as poison (resume answers 200)
    unknown: str  # parked on an outcome-unknown step
    unknown_step: str
    with_history: str  # a recorded step and a late observation


@dataclass
class Live:
    app: object
    settings: Settings
    tokens: dict[str, str]  # role -> token
    seeded: Seeded


def hostile_settings(settings: Settings, **changes) -> Settings:
    return settings.model_copy(update={"auth": "enabled", "workflows": "",
                                       "max_unacknowledged_deliveries": 1, **changes})


_admit = admitting("seed-wf", params={"n": 1})


async def seed(pool: asyncpg.Pool, settings: Settings) -> Seeded:
    store = ExecutionStore.from_settings(pool, settings)
    s = Seeded("s-pending", "s-completed", "s-running", "s-poison", "s-unknown", "charge",
               "s-history")
    await _admit(store, s.pending, workflow_id="seed-wf")

    await _admit(store, s.completed, workflow_id="seed-done")
    [d] = await store.leases.claim_due(1, 30, "seed-worker", ["seed-done"])
    await store.leases.acknowledge(d.lease, "completed", result={"ok": True})

    await _admit(store, s.running, workflow_id="seed-run")
    [d] = await store.leases.claim_due(1, 3600, "seed-worker", ["seed-run"])

    await _admit(store, s.poison, workflow_id="seed-poison")
    [d] = await store.leases.claim_due(1, 30, "seed-worker", ["seed-poison"])
    await store.leases.release(d.lease)  # max_unacknowledged_deliveries = 1: parked as poison

    await _admit(store, s.unknown, workflow_id="seed-unknown")
    [d] = await store.leases.claim_due(1, 30, "seed-worker", ["seed-unknown"])
    await store.effects.begin_effect(d.lease, s.unknown_step, idempotency_key="idem-1",
                             function_name="charge")
    await store.effects.park_outcome_unknown(d.lease, s.unknown_step)

    await _admit(store, s.with_history, workflow_id="seed-history")
    [d] = await store.leases.claim_due(1, 30, "seed-worker", ["seed-history"])
    await store.steps.write_step(d.lease, "first", value={"v": 1})
    await store.leases.acknowledge(d.lease, "suspended")
    assert await store.operator.request_wake(s.with_history) == "requested"
    assert len(await store.leases.claim_due(1, 30, "seed-worker-2", ["seed-history"])) == 1
    # The first holder, now stale, observes something late.
    await store.steps.record_late_observation(d.lease, "second", value={"late": True})
    await store.workers.register_worker("seed-worker", host="h", pid=1, workflows=["seed-wf"],
                                concurrency=1)

    rows = {r["execution_id"]: (r["status"], r["parked_reason"]) for r in await pool.fetch(
        "SELECT execution_id, status, parked_reason FROM executions")}
    assert rows[s.poison] == ("parked", "poison"), rows
    assert rows[s.unknown] == ("parked", "outcome_unknown"), rows
    assert rows[s.completed][0] == "completed" and rows[s.running][0] == "running", rows
    return s


async def make_tokens(pool: asyncpg.Pool, settings: Settings) -> dict[str, str]:
    store = ExecutionStore.from_settings(pool, settings)
    tokens = {}
    for role in ("trigger", "read", "operate"):
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=f"hostile-{role}", role=role,
                                 secret_sha256=digest)
        tokens[role] = token
    # A trigger token with quotas of one a minute: its second admission and
    # second signal are 429 RATE_LIMITED.
    token_id, token, digest = new_token()
    await store.tokens.create_token(token_id, name="hostile-limited", role="trigger",
                             secret_sha256=digest, admissions_per_minute=1, signals_per_minute=1)
    tokens["limited"] = token
    return tokens


@pytest_asyncio.fixture
async def live(pool: asyncpg.Pool, settings: Settings) -> Live:
    s = hostile_settings(settings)
    seeded = await seed(pool, s)
    tokens = await make_tokens(pool, s)
    return Live(create_app(s, workflows=None), s, tokens, seeded)

