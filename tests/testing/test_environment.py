"""app.testing.WorkflowEnvironment, tested on the example workflows and a few
of its own: time skipping (a 7-day approval window in well under a second of
wall time), signals with senders, stand-ins for step and effect functions,
deadlines, and that other executions in the database keep their times."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pydantic import ValidationError

import app.examples.refunds as refunds
import app.examples.shop as shop
from app.sdk import SignalSender
from app.store import ExecutionStore
from app.testing import ExecutionFailed, WorkflowEnvironment
from tests.testing import flows

WEEK = 7 * 86400
pytestmark = pytest.mark.asyncio


async def test_seven_day_approval_times_out_in_well_under_a_second(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 7, "amount_cents": 500,
                                                 "approval_timeout_seconds": WEEK})
        record = await env.wait_suspended(eid)
        assert record["status"] == "suspended"
        began = time.monotonic()
        await env.skip(timedelta(days=7))
        result = await env.result(eid)
        wall = time.monotonic() - began
        print(f"7-day approval timeout: {wall * 1000:.0f} ms wall")
    assert result == {"refunded": False, "reason": "no decision in time"}
    assert wall < 1.0, wall


async def test_seven_day_approval_approved_after_six_days(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 8, "amount_cents": 900,
                                                 "approval_timeout_seconds": WEEK})
        await env.wait_suspended(eid)
        # From the skip on, as the timeout test measures: the start and the
        # first delivery are not time skipping (their wall time made this
        # 1.016 s on a loaded CI machine).
        began = time.monotonic()
        await env.skip(timedelta(days=6))
        assert (await env.get(eid))["status"] == "suspended"  # a day of the window is left
        operator = SignalSender(token_id="tok_ops", name="alice", role="operate")
        await env.signal(eid, "approval", {"approved": True}, sender=operator)
        result = await env.result(eid)
        wall = time.monotonic() - began
    assert result["refunded"] is True
    assert result["approvedBy"] == {"tokenId": "tok_ops", "name": "alice", "role": "operate"}
    assert result["refund"] == {"refundId": "re_8", "amountCents": 900}
    assert wall < 1.0, wall


async def test_skipping_less_than_the_timeout_does_not_end_the_wait(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 9, "amount_cents": 1,
                                                 "approval_timeout_seconds": WEEK})
        await env.wait_suspended(eid)
        await env.skip(timedelta(days=6, hours=23))
        await env.wait_idle()
        assert (await env.get(eid))["status"] == "suspended"
        await env.skip(timedelta(hours=1, seconds=1))
        assert (await env.result(eid))["reason"] == "no decision in time"


async def test_signal_restriction_applies_to_the_harness_sender(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 10, "amount_cents": 1})
        with pytest.raises(PermissionError):
            await env.signal(eid, "approval", {"approved": True},
                             sender=SignalSender(token_id="tok_svc", name="svc", role="trigger"))


async def test_stand_in_for_a_step_function(database_url):
    calls = []

    def fake_refund(order_id: int, amount_cents: int) -> dict:
        calls.append((order_id, amount_cents))
        return {"refundId": "fake", "amountCents": amount_cents}

    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        env.replace(refunds.issue_refund, fake_refund)
        eid = await env.start("approve-refund", {"order_id": 11, "amount_cents": 300})
        await env.wait_suspended(eid)
        await env.signal(eid, "approval", {"approved": True})
        result = await env.result(eid)
    assert result["refund"] == {"refundId": "fake", "amountCents": 300}
    assert calls == [(11, 300)]
    assert refunds.issue_refund is not fake_refund  # restored when the environment closed


async def test_charge_order_with_a_stand_in_for_the_effect_and_skipped_cancel_window(database_url):
    charged = []

    def fake_charge(order: dict, amount_cents: int, idempotency_key: str) -> dict:
        charged.append(idempotency_key)
        return {"chargeId": "ch_fake", "orderId": order["orderId"], "amountCents": amount_cents}

    async with WorkflowEnvironment(database_url, workflows=[shop]) as env:
        env.replace(shop.payments.charge, fake_charge)
        began = time.monotonic()
        eid = await env.start("charge-order", {"order_id": 42, "cancel_window_seconds": 86400})
        result = await env.result(eid, skip_time=True)
        wall = time.monotonic() - began
    assert result == {"charged": True,
                      "receipt": {"chargeId": "ch_fake", "orderId": 42, "amountCents": 1999}}
    assert charged == [f"{eid}:charge-card"]
    assert wall < 1.0, wall
    assert "charge" not in vars(shop.payments)  # the instance attribute is gone again


async def test_result_with_skip_time_runs_a_month_of_sleeps(database_url):
    async with WorkflowEnvironment(database_url, workflows=[flows]) as env:
        began = time.monotonic()
        eid = await env.start("testing-sleepy")
        result = await env.result(eid, skip_time=True)
        wall = time.monotonic() - began
        assert env.skipped >= timedelta(days=31) - timedelta(minutes=1)
    assert result == {"sent": ["reminder 1", "reminder 2"]}
    assert wall < 2.0, wall


async def test_a_deadline_passes_when_skipped(database_url):
    async with WorkflowEnvironment(database_url, workflows=[flows]) as env:
        eid = await env.start("testing-deadline")
        await env.wait_suspended(eid)
        await env.skip(timedelta(days=7, seconds=1))
        with pytest.raises(ExecutionFailed) as failed:
            await env.result(eid)
    assert failed.value.status == "timed_out"


async def test_steps_may_be_gathered(database_url):
    async with WorkflowEnvironment(database_url, workflows=[flows]) as env:
        eid = await env.start("testing-gather")
        assert await env.result(eid) == [0, 2, 4, 6, 8]


async def test_params_are_validated_like_the_api(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        with pytest.raises(ValidationError):
            await env.start("approve-refund", {"order_id": -1, "amount_cents": 1})


async def test_skip_leaves_other_executions_alone(database_url, pool, settings):
    store = ExecutionStore.from_settings(pool, settings)
    await store.admissions.admit(workflow_id="elsewhere", params={}, execution_id="not-mine")
    before = await pool.fetchval("SELECT due_at FROM executions WHERE execution_id = 'not-mine'")
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 12, "amount_cents": 1})
        await env.wait_suspended(eid)
        await env.skip(timedelta(hours=2))
        assert (await env.result(eid))["reason"] == "no decision in time"
    after = await pool.fetchval("SELECT due_at FROM executions WHERE execution_id = 'not-mine'")
    assert after == before


async def test_children_gathered_and_their_sleeps_skipped(database_url):
    async with WorkflowEnvironment(database_url, workflows=[flows]) as env:
        began = time.monotonic()
        eid = await env.start("testing-fanout")
        result = await env.result(eid, skip_time=True)
        wall = time.monotonic() - began
    assert result == [0, 2, 4, 6]
    assert wall < 2.0, wall


async def test_cancel_a_waiting_approval(database_url):
    async with WorkflowEnvironment(database_url, workflows=[refunds]) as env:
        eid = await env.start("approve-refund", {"order_id": 13, "amount_cents": 1})
        await env.wait_suspended(eid)
        await env.cancel(eid)
        with pytest.raises(ExecutionFailed) as ended:
            await env.result(eid)
    assert ended.value.status == "cancelled"
