"""Changing, pausing, resuming and reading queues, called directly against Postgres."""

from __future__ import annotations

import logging

import pytest

from app.commands import queues
from tests.commands.test_executions import refused


async def test_reading_an_unknown_queue_is_not_found(store) -> None:
    e = await refused(queues.read_queue(store, "nowhere"), 404, "QUEUE_NOT_FOUND")
    assert e.message == "no queue named 'nowhere'; list them with GET /v1/queues"
    await refused(queues.read_queue(store, "bad name\x00"), 404, "QUEUE_NOT_FOUND")


@pytest.mark.parametrize(("name", "given", "reset", "says"), [
    ("bad name", {}, [], "queue name 'bad name' must be"),
    ("q", {"concurrency": 0}, [], "concurrency must be an integer from 1"),
    ("q", {"concurrency": True}, [], "concurrency must be an integer from 1"),
    ("q", {"rate_limit": 5}, [], "rate_limit and rate_period go together"),
    ("q", {"rate_per_key": True}, [], "rate_per_key is set with rate_limit and rate_period"),
    ("q", {"paused": None}, [], "paused must be true or false"),
    ("q", {"speed": 3}, [], "unknown queue settings: speed"),
    ("q", {}, ["speed"], "reset: unknown queue settings: speed"),
])
async def test_settings_that_cannot_be_stored_are_refused_with_what_to_fix(
        store, name, given, reset, says) -> None:
    e = await refused(queues.change_queue(store, name, given, reset, "alice"),
                      422, "INVALID_QUEUE_SETTINGS")
    assert says in e.message
    assert await store.queues.get("q") is None


async def test_a_change_overrides_the_declared_setting_until_reset(store, caplog) -> None:
    caplog.set_level(logging.INFO)
    await store.queues.declare({"payments": {"concurrency": 5, "per_key_concurrency": None,
                                             "rate_limit": 100, "rate_period": 60.0,
                                             "rate_per_key": False,
                                             "hold_while_suspended": False}})
    row = await queues.change_queue(store, "payments", {"concurrency": 2, "rate_limit": None,
                                                        "rate_period": None}, [], "alice")
    assert (row["concurrency"], row["rate_limit"]) == (2, None)
    assert row["declared"]["concurrency"] == 5
    row = await queues.change_queue(store, "payments", {}, ["concurrency", "rate_limit"], "bob")
    assert (row["concurrency"], row["rate_limit"], row["rate_period"]) == (5, 100, 60.0)
    assert row["override"] == {}
    assert (await queues.pause(store, "payments", "carol"))["paused"] is True
    assert (await queues.resume(store, "payments", "dave"))["paused"] is False
    view = await queues.read_queue(store, "payments")
    assert [(c["actor"], c["change"]) for c in view["changes"][:4]] == [
        ("dave", {"set": {"paused": False}, "reset": []}),
        ("carol", {"set": {"paused": True}, "reset": []}),
        ("bob", {"set": {}, "reset": ["concurrency", "rate_limit", "rate_per_key",
                                      "rate_period"]}),
        ("alice", {"set": {"concurrency": 2, "rate_limit": None, "rate_period": None},
                   "reset": []}),
    ]
    assert [(r.action, r.by, r.result, r.queue) for r in caplog.records
            if getattr(r, "kind", None) == "operator_action"] == [
        ("change", "alice", "done", "payments"), ("change", "bob", "done", "payments"),
        ("pause", "carol", "done", "payments"), ("resume", "dave", "done", "payments")]


async def test_a_setting_both_reset_and_given_takes_the_given_value(store) -> None:
    await queues.change_queue(store, "both", {"concurrency": 2, "paused": True}, [], "a")
    row = await queues.change_queue(store, "both", {"concurrency": 3},
                                    ["concurrency", "paused"], "a")
    assert row["override"] == {"concurrency": 3}


async def test_a_change_creates_an_unknown_queue(store) -> None:
    row = await queues.change_queue(store, "fresh", {"per_key_concurrency": 1}, [], "alice")
    assert row["per_key_concurrency"] == 1
    view = await queues.read_queue(store, "fresh")
    assert view["counts"] == {"running": 0, "due": 0, "starts_in_period": None}
    assert view["queue"]["name"] == "fresh"


async def test_a_queue_counts_what_runs_and_what_is_due(store) -> None:
    await queues.change_queue(store, "counted", {"rate_limit": 10, "rate_period": 60}, [], "a")
    for i in range(3):
        await store.admissions.admit(workflow_id="cmd-done", params={}, execution_id=f"c{i}",
                                     queue="counted")
    await store.admissions.admit(workflow_id="cmd-done", params={}, execution_id="later",
                                 queue="counted", delay_seconds=3600)
    [delivery] = await store.leases.claim_due(1, 30.0, "w1")
    assert delivery.queue == "counted"
    view = await queues.read_queue(store, "counted")
    assert view["counts"] == {"running": 1, "due": 2, "starts_in_period": 1}


@pytest.mark.parametrize("action", [queues.pause, queues.resume])
async def test_pausing_or_resuming_an_unknown_queue_is_not_found(store, action) -> None:
    await refused(action(store, "nowhere", "alice"), 404, "QUEUE_NOT_FOUND")
    await refused(action(store, "bad\x00", "alice"), 404, "QUEUE_NOT_FOUND")
    assert await store.queues.get("nowhere") is None
