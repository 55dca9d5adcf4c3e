"""Pausing, resuming and deleting schedules, called directly against Postgres."""

from __future__ import annotations

import logging

import pytest

from app.commands import schedules
from tests.commands.test_executions import refused


@pytest.mark.parametrize("paused", [True, False])
async def test_pausing_or_resuming_a_missing_schedule_is_not_found(store, paused) -> None:
    e = await refused(schedules.set_paused(store, "nightly", paused, "alice"),
                      404, "SCHEDULE_NOT_FOUND")
    assert e.message == "no schedule with ID 'nightly'; list them with GET /v1/schedules"
    await refused(schedules.set_paused(store, "bad id\x00", paused, "alice"),
                  404, "SCHEDULE_NOT_FOUND")


async def test_deleting_a_missing_schedule_is_not_found(store) -> None:
    await refused(schedules.delete(store, "nightly", "alice"), 404, "SCHEDULE_NOT_FOUND")
    await refused(schedules.delete(store, "a" * 300, "alice"), 404, "SCHEDULE_NOT_FOUND")


async def test_a_schedule_is_paused_resumed_and_deleted_with_who_did_it(store, caplog) -> None:
    caplog.set_level(logging.INFO)
    created, _ = await store.schedules.create_schedule(
        schedule_id="nightly", workflow_id="cmd-done", cron="0 3 * * *", timezone="UTC",
        params={}, catch_up=1, by="alice")
    assert created
    assert (await schedules.set_paused(store, "nightly", True, "alice"))["paused"] is True
    assert (await schedules.set_paused(store, "nightly", False, "bob"))["paused"] is False
    await schedules.delete(store, "nightly", "carol")
    assert await store.schedules.get_schedule("nightly") is None
    assert [(r.action, r.by, r.result) for r in caplog.records
            if getattr(r, "kind", None) == "operator_action"] == [
        ("pause", "alice", "done"), ("resume", "bob", "done"), ("delete", "carol", "done")]
