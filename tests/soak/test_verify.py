"""The soak's verification really finds violations: histories written by hand
(no workers) into a fresh database, some clean and some broken, and the
counts `fencepost soak` would report for them."""

from __future__ import annotations

import json

import asyncpg
import pytest

from app.db import asyncpg_dsn
from app.tools.soak_verify import verify

STEPS = ("one", "pause", "two", "three")


async def _execution(conn, eid: str, status: str, n: int = 1, result_n: int | None = None):
    outcome = None
    if status == "completed":
        outcome = {"result": {"n": n + 3 if result_n is None else result_n}}
    elif status in ("failed", "cancelled", "timed_out"):
        outcome = {"error": {"name": "Error", "message": "x"}}
    await conn.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, status, outcome) "
        "VALUES ($1, fencepost_bucket($1), 'soak-steps', $2::jsonb, $3, $4::jsonb)",
        eid, json.dumps({"n": n}), status, None if outcome is None else json.dumps(outcome))


async def _events(conn, eid: str, *events: tuple):
    """(kind, token) or (kind, token, detail) in history order."""
    for kind, token, *rest in events:
        await conn.execute(
            "INSERT INTO execution_events (execution_id, bucket, kind, token, detail, seq) "
            "VALUES ($1, fencepost_bucket($1), $2, $3, $4::jsonb, "
            "        (SELECT count(*) + 1 FROM execution_events "
            "         WHERE execution_id = $1 AND bucket = fencepost_bucket($1)))",
            eid, kind, token, json.dumps(rest[0]) if rest else None)


def _step(key: str, token: int) -> tuple:
    return ("step_recorded", token, {"stepKey": key, "status": "completed"})


def _ack(status: str, token: int) -> tuple:
    return ("acknowledged", token, {"status": status, "reported": status})


async def _step_rows(conn, eid: str, tokens: dict[str, int]):
    for key, token in tokens.items():
        await conn.execute(
            "INSERT INTO execution_steps (execution_id, bucket, step_key, status, value, token) "
            "VALUES ($1, fencepost_bucket($1), $2, 'completed', '1'::jsonb, $3)", eid, key, token)


def _clean_history(first: int = 1, second: int = 2) -> list[tuple]:
    return [("claimed", first), _step("one", first), _step("pause", first),
            _ack("suspended", first), ("claimed", second), _step("two", second),
            _step("three", second), _ack("completed", second)]


@pytest.fixture
async def conn(database_url):
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        yield c
    finally:
        await c.close()


async def test_a_clean_history_passes_every_check(conn):
    await _execution(conn, "r-1", "completed")
    await _events(conn, "r-1", ("claimed", 1), _step("one", 1), ("lease_expired", 1),
                  ("claimed", 2), _step("pause", 2), _ack("suspended", 2),
                  ("claimed", 3), _step("two", 3), _step("three", 3), _ack("completed", 3))
    await _step_rows(conn, "r-1", {"one": 1, "pause": 2, "two": 3, "three": 3})
    # Rejected stale writes are not accepted ones.
    await _execution(conn, "r-2", "completed")
    await _events(conn, "r-2", *_clean_history()[:4], ("claimed", 2), ("lease_expired", 2),
                  ("claimed", 3), ("fenced_write_rejected", 2, {"stepKey": "two"}),
                  _step("two", 3), _step("three", 3), _ack("completed", 3))
    await _step_rows(conn, "r-2", {"one": 1, "pause": 1, "two": 3, "three": 3})

    v = await verify(conn, "r-%", ["r-1", "r-2"])
    assert v["completions"] == 2 and v["non_terminal"] == 0
    assert v["leases_taken_over"] == 2 and v["leases_expired"] == 2
    assert v["stale_writes_rejected"] == 1
    assert v["stale_writes_accepted"] == 0, v["_examples"]
    assert v["steps_recorded_more_than_once"] == 0
    assert v["step_rows_inconsistent"] == 0, v["_examples"]
    assert v["wrong_results"] == 0 and v["terminal_outcomes_more_than_once"] == 0
    assert v["executions_not_admitted_by_client"] == 0


async def test_violations_are_counted(conn):
    # A write after a newer claim, a write after its own lease ended (expired,
    # acknowledged, released), a write by a token never claimed.
    await _execution(conn, "r-1", "failed")
    await _events(conn, "r-1", ("claimed", 1), ("lease_expired", 1), ("claimed", 2),
                  _step("one", 1))
    await _execution(conn, "r-2", "failed")
    await _events(conn, "r-2", ("claimed", 1), _ack("suspended", 1), _step("two", 1))
    await _execution(conn, "r-3", "failed")
    await _events(conn, "r-3", ("claimed", 1), ("lease_expired", 1), _ack("failed", 1))
    await _execution(conn, "r-4", "failed")
    await _events(conn, "r-4", ("claimed", 1), ("released", 1), ("released", 1))
    await _execution(conn, "r-5", "failed")
    await _events(conn, "r-5", ("claimed", 1), _step("one", 3))
    # A step recorded twice; two terminal acknowledgements.
    await _execution(conn, "r-6", "failed")
    await _events(conn, "r-6", ("claimed", 1), _step("one", 1), ("claimed", 2),
                  _step("one", 2), _ack("failed", 2), _ack("failed", 2))
    # Completed, but a step row carries another token than its event, one step
    # row is missing, and the result is wrong.
    await _execution(conn, "r-7", "completed", n=5, result_n=7)
    await _events(conn, "r-7", *_clean_history())
    await _step_rows(conn, "r-7", {"one": 1, "pause": 1, "two": 1})
    # Not terminal, and one the client never saw admitted.
    await _execution(conn, "r-8", "admitted")
    await _execution(conn, "r-9", "suspended")
    # Other runs' executions are not counted.
    await _execution(conn, "other-1", "admitted")
    await _events(conn, "other-1", ("claimed", 1), ("claimed", 2), _step("one", 1))

    v = await verify(conn, "r-%", [f"r-{i}" for i in range(1, 9)])
    stale = {(r["execution_id"], r["why"]) for r in v["_examples"]["stale"]}
    assert stale == {
        ("r-1", "after a newer claim"),
        ("r-2", "after its lease ended"),
        ("r-3", "after its lease ended"),
        ("r-4", "after its lease ended"),
        ("r-5", "without a claim"),
        ("r-6", "after its lease ended"),  # the second terminal acknowledgement
    }, v["_examples"]["stale"]
    assert v["stale_writes_accepted"] == 6
    assert v["steps_recorded_more_than_once"] == 1
    assert v["_examples"]["twice"][0]["execution_id"] == "r-6"
    assert v["terminal_outcomes_more_than_once"] == 1
    assert {(r["execution_id"], r["step_key"]) for r in v["_examples"]["inconsistent"]} == {
        ("r-7", "two"), ("r-7", "three")}
    assert v["step_rows_inconsistent"] == 2
    assert v["wrong_results"] == 1
    assert v["non_terminal"] == 2
    assert v["completions"] == 1
    assert v["executions_in_database"] == 9
    assert v["executions_not_admitted_by_client"] == 1
