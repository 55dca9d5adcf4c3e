"""The workflow SDK, exercised through a real in-process Worker on Postgres:
replay, durable timers, signals, retry policies, step-result checks, replay
safety, sync steps, the Retry reply, failures and results, and what workflow
code can read from its context. One test per behaviour.

Time moves by UPDATE-ing the recorded timer and the pending wake (see
helpers.fast_forward_timer); only `test_replay_skips_recorded_steps` (0.3 s)
and the two tests of when an idle worker wakes for a timer (about 2 s each) wait
for real timers.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from app.store import NOTIFY_CHANNEL
from tests.sdk import flows
from tests.support.admission import admit
from tests.support.clocks import fast_forward_timer, parse_ts
from tests.support.history import events_of, kinds_ignoring_late_renewals, signal_rows, step_rows
from tests.support.waiting import wait_event, wait_status, wait_until

# ------------------------------------------------------------------- replay


async def test_replay_skips_recorded_steps(store, pool, workers):
    await workers.start()
    eid = await admit(store, "sdk-replay", "replay-1", {"seconds": 0.3})

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {"before": "before", "after": "after"}}
    # Two deliveries replayed the body; the step recorded by the first was
    # returned from the record by the second, not run again.
    assert flows.calls(eid, "body") == 2
    assert flows.calls(eid, "before") == 1
    assert flows.calls(eid, "after") == 1
    assert len(await events_of(store, eid, "claimed")) == 2
    recorded = await step_rows(pool, eid)
    assert set(recorded) == {"before", "nap", "after"}
    assert recorded["before"]["token"] == 1 and recorded["after"]["token"] == 2


# ------------------------------------------------------------------- timers


async def test_sleep_suspends_until_the_recorded_wake_time_and_resumes_once_due(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "sdk-sleep", "sleep-1")

    record = await wait_status(store, eid, "suspended")
    recorded = await step_rows(pool, eid)
    wake_at = parse_ts(recorded["nap"]["value"])
    assert recorded["nap"]["function_name"] == "sleep"
    # The wake time is database time: about an hour after the delivery.
    assert timedelta(minutes=59) < wake_at - record["read_at"] <= timedelta(hours=1)
    assert record["due_at"] == wake_at
    assert record["outcome"] is None and record["lease_owner"] is None
    assert flows.calls(eid, "before") == 1 and flows.calls(eid, "after") == 0

    await fast_forward_timer(pool, eid, "nap")
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": "woke"}
    assert flows.calls(eid, "before") == 1 and flows.calls(eid, "after") == 1
    assert record["token"] == 2


async def test_sleep_until_suspends_until_the_given_time_and_resumes(store, pool, workers):
    await workers.start()
    until = await store.clock.db_now() + timedelta(hours=2, microseconds=123)
    eid = await admit(store, "sdk-sleep-until", "until-1", {"until": until.isoformat()})

    record = await wait_status(store, eid, "suspended")
    assert record["due_at"] == until
    assert parse_ts((await step_rows(pool, eid))["until"]["value"]) == until
    assert flows.calls(eid, "after") == 0

    await fast_forward_timer(pool, eid, "until")
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": "woke"}
    assert flows.calls(eid, "after") == 1


async def test_an_idle_worker_wakes_at_the_next_due_time_not_at_its_next_poll(store, workers):
    # Polling only every 60 s, the worker still runs a timer due in 2 s about
    # when it is due: it waits until the earliest due time it knows of (its
    # claim's answer; a suspension of its own wakes it to claim), capped by
    # the poll interval.
    await workers.start(poll_seconds=60.0)
    until = await store.clock.db_now() + timedelta(seconds=2)
    eid = await admit(store, "sdk-sleep-until", "until-on-time", {"until": until.isoformat()})
    await wait_status(store, eid, "suspended")

    record = await wait_status(store, eid, "completed", timeout=20)

    assert flows.calls(eid, "after") == 1
    assert record["updated_at"] < until + timedelta(seconds=20)


async def test_a_timer_set_while_the_worker_claims_is_still_claimed_when_due(
        store, pool, workers):
    # The other interleaving, forced: the suspension commits after a claim
    # of the same worker has read the due times (so its answer cannot tell
    # of this timer) and before that claim returns. With a 60 s poll, the
    # timer still runs about when it is due.
    worker = await workers.start(poll_seconds=60.0)
    leases = worker.store.leases
    claim_due, acknowledge = leases.claim_due, leases.acknowledge
    claimed, acked = asyncio.Event(), asyncio.Event()
    suspending: list[str] = []

    async def claim_then_wait(*args, **kwargs):
        # Only a claim begun after the NOTIFY below was sent: the wake it
        # caused was spent before this claim, none is left to claim again.
        hold = bool(suspending) and not claimed.is_set()
        answer = await claim_due(*args, **kwargs)
        if hold:
            claimed.set()  # read before the suspension: it cannot know it
            await acked.wait()
        return answer

    async def acknowledge_during_a_claim(lease, status, **kwargs):
        if status == "suspended" and not acked.is_set():
            suspending.append(lease.execution_id)
            await pool.execute("SELECT pg_notify($1, '')", NOTIFY_CHANNEL)  # a claim, now
            await claimed.wait()
            try:
                return await acknowledge(lease, status, **kwargs)
            finally:
                acked.set()
        return await acknowledge(lease, status, **kwargs)

    leases.claim_due = claim_then_wait  # type: ignore[method-assign]
    leases.acknowledge = acknowledge_during_a_claim  # type: ignore[method-assign]
    until = await store.clock.db_now() + timedelta(seconds=2)
    eid = await admit(store, "sdk-sleep-until", "until-mid-claim", {"until": until.isoformat()})

    record = await wait_status(store, eid, "completed", timeout=20)

    assert suspending == [eid] and claimed.is_set()
    assert flows.calls(eid, "after") == 1
    assert record["updated_at"] < until + timedelta(seconds=20)


async def test_sleep_until_a_past_time_does_not_suspend(store, workers):
    await workers.start()
    until = await store.clock.db_now() - timedelta(minutes=1)
    eid = await admit(store, "sdk-sleep-until", "until-past", {"until": until.isoformat()})

    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": "woke"}
    assert len(await events_of(store, eid, "claimed")) == 1
    assert [e["detail"]["status"] for e in await events_of(store, eid, "acknowledged")] == [
        "completed"
    ]


# ------------------------------------------------------------------ signals


async def test_signals_are_consumed_once_each_in_order(store, pool, workers):
    eid = await admit(store, "sdk-signals", "signals-1")
    # Sent before any worker runs, so before the wait: it is kept and consumed.
    assert await store.signals.send_signal(eid, "go", {"n": 1}) == ("received", None)
    await workers.start()

    await wait_status(store, eid, "suspended")
    await wait_until(lambda: flows.calls(eid, "between") == 1, what="step between")
    sig = await signal_rows(pool, eid)
    assert [(s["payload"], s["consumed_step"], s["consumed_token"]) for s in sig] == [
        ({"n": 1}, "first", 1)
    ]

    # A duplicate delivery (an extra wake) replays `first` from its record:
    # it consumes nothing more and suspends again on `second`.
    assert await store.operator.request_wake(eid) == "requested"
    await wait_event(store, eid, "acknowledged", count=2)
    await wait_status(store, eid, "suspended")
    assert flows.calls(eid, "body") == 2
    assert flows.calls(eid, "between") == 1
    assert [s["consumed_step"] for s in await signal_rows(pool, eid)] == ["first"]

    assert (await store.signals.send_signal(eid, "go", {"n": 2}))[0] == "received"
    assert (await store.signals.send_signal(eid, "go", {"n": 3}))[0] == "received"
    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": [{"n": 1}, {"n": 2}]}
    sig = await signal_rows(pool, eid)
    assert [(s["payload"], s["consumed_step"]) for s in sig] == [
        ({"n": 1}, "first"),
        ({"n": 2}, "second"),
        ({"n": 3}, None),  # one wait, one signal: the third stays unconsumed
    ]
    consumed = await events_of(store, eid, "signal_consumed")
    assert [e["detail"]["stepKey"] for e in consumed] == ["first", "second"]
    steps = await step_rows(pool, eid)
    assert steps["first"]["value"] == {"n": 1} and steps["second"]["value"] == {"n": 2}
    assert steps["first"]["function_name"] == "signal:go"


async def test_wait_for_signal_timeout_raises_signal_timeout_recorded_for_replay(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "sdk-signal-timeout", "sigtimeout-1")

    record = await wait_status(store, eid, "suspended")
    timer = parse_ts((await step_rows(pool, eid))["signal:approval:timeout"]["value"])
    assert record["due_at"] == timer  # suspended until the timeout
    assert flows.calls(eid, "timeout-branch") == 0

    await fast_forward_timer(pool, eid, "signal:approval:timeout")
    await wait_event(store, eid, "acknowledged", count=2)
    await wait_status(store, eid, "suspended")  # now on the `after` sleep
    steps = await step_rows(pool, eid)
    assert steps["signal:approval"]["status"] == "failed"
    assert steps["signal:approval"]["error"]["name"] == "SignalTimeout"
    assert flows.calls(eid, "timeout-branch") == 1

    # A signal arriving after the recorded timeout wakes the execution, but the
    # replay agrees with the record: SignalTimeout again, the signal unconsumed.
    assert (await store.signals.send_signal(eid, "approval", {"ok": True}))[0] == "received"
    await wait_event(store, eid, "acknowledged", count=3)
    await wait_status(store, eid, "suspended")
    assert flows.calls(eid, "timeout-branch") == 2

    await fast_forward_timer(pool, eid, "after")
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {
        "result": {"timeout": "signal:approval", "signal": "approval"}
    }
    assert [s["consumed_step"] for s in await signal_rows(pool, eid)] == [None]


async def test_uncaught_signal_timeout_fails_the_execution(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-signal-timeout-uncaught", "sigtimeout-uncaught")

    record = await wait_status(store, eid, "failed", timeout=4)
    assert record["outcome"]["error"]["name"] == "SignalTimeout"
    assert flows.calls(eid, "body") == 1


# -------------------------------------------------------------------- retry


async def test_retry_policy_retries_a_failing_step_until_it_succeeds(store, pool, workers):
    await workers.start()
    eid = await admit(store, "sdk-retry-succeeds", "retry-ok")

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": "ok after 3"}
    assert flows.calls(eid, "flaky") == 3
    step = (await step_rows(pool, eid))["flaky"]
    assert (step["status"], step["attempts"], step["value"]) == ("completed", 3, "ok after 3")
    assert len(await events_of(store, eid, "claimed")) == 1  # retried inside one delivery


async def test_retry_policy_non_retryable_exception_fails_the_step_at_once(store, pool, workers):
    await workers.start()
    eid = await admit(store, "sdk-non-retryable", "retry-strict")

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {
        "result": {"stepKey": "charge", "name": "Declined", "message": "card declined"}
    }
    assert flows.calls(eid, "strict") == 1
    step = (await step_rows(pool, eid))["charge"]
    assert (step["status"], step["attempts"]) == ("failed", 1)
    assert step["error"] == {"name": "Declined", "message": "card declined"}


async def test_retry_policy_exhausted_raises_step_failed_into_the_workflow(store, pool, workers):
    await workers.start()
    eid = await admit(store, "sdk-exhausted", "retry-exhausted")

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {
        "caught": True, "stepKey": "doomed", "name": "RuntimeError", "message": "attempt 2 failed",
    }}
    step = (await step_rows(pool, eid))["doomed"]
    assert (step["status"], step["attempts"]) == ("failed", 2)
    # The second delivery (after the sleep) replayed the recorded failure:
    # StepFailed again, the function not called again.
    assert flows.calls(eid, "doomed") == 2
    assert flows.calls(eid, "caught") == 2
    assert len(await events_of(store, eid, "claimed")) == 2


# ----------------------------------------------------------- step results


@pytest.mark.parametrize("kind", ["set", "nan", "object", "nul", "surrogate"])
async def test_non_json_step_result_fails_the_step_naming_it(store, pool, workers, kind):
    await workers.start()
    eid = await admit(store, "sdk-non-json-step", f"non-json-step-{kind}", {"kind": kind})

    record = await wait_status(store, eid, "failed")

    step = (await step_rows(pool, eid))["produce"]
    assert step["status"] == "failed" and step["value"] is None
    assert step["error"]["name"] == "StepResultNotJSON"
    assert "'produce'" in step["error"]["message"]
    error = record["outcome"]["error"]
    assert error["name"] == "StepFailed" and "'produce'" in error["message"]
    assert flows.calls(eid, "non-json") == 1


# "nul" and "surrogate" pass json.dumps but not jsonb: the acknowledgement
# itself is refused and the worker falls back to a ResultNotJSON failure.
@pytest.mark.parametrize("kind", ["nan", "set", "nul", "surrogate"])
async def test_non_json_workflow_result_fails_the_execution(store, workers, kind):
    await workers.start()
    eid = await admit(store, "sdk-non-json-result", f"non-json-result-{kind}", {"kind": kind})

    record = await wait_status(store, eid, "failed", timeout=4)

    assert record["outcome"]["error"]["name"] == "ResultNotJSON"
    assert flows.calls(eid, "body") == 1


# ----------------------------------------------------------- replay safety


async def test_step_key_used_twice_fails_with_replay_error_naming_the_key(store, pool, workers):
    await workers.start()
    eid = await admit(store, "sdk-dup-key", "dup-key")

    record = await wait_status(store, eid, "failed")

    error = record["outcome"]["error"]
    assert error["name"] == "ReplayError"
    assert "'dup'" in error["message"]
    assert flows.calls(eid, "dup") == 1  # the second use never ran
    assert list(await step_rows(pool, eid)) == ["dup"]


async def test_recorded_step_key_with_a_different_function_parks_naming_the_step(
    store, pool, workers
):
    await workers.start()
    eid = await admit(store, "sdk-fn-changed", "fn-changed")
    await wait_status(store, eid, "suspended")
    assert (await step_rows(pool, eid))["load"]["function_name"] == "load_v1"

    flows.STEP_VERSION[eid] = "v2"  # a new code version calls another function under "load"
    await fast_forward_timer(pool, eid, "nap")
    record = await wait_status(store, eid, "parked")

    # Parked, not failed: the code no longer fits the history, and a deploy
    # that fits (or a move to a version that does) resumes it.
    assert record["parked_reason"] == "nondeterminism"
    divergence = record["parked_detail"]
    assert divergence["recorded"] == "load" and divergence["asked"] == "load"
    assert "load_v1" in divergence["message"] and "load_v2" in divergence["message"]
    assert flows.calls(eid, "v1") == 1 and flows.calls(eid, "v2") == 0
    assert (await step_rows(pool, eid))["load"]["value"] == "v1"


# -------------------------------------------------------------- sync steps


async def test_sync_step_functions_run_in_a_thread_without_blocking_the_loop(store, workers):
    await workers.start(concurrency=2)
    blocker = await admit(store, "sdk-sync-blocker", "sync-blocker")
    await wait_until(lambda: flows.calls(blocker, "blocking:start") == 1, what="blocking step")

    # While the blocker's sync step blocks its thread, another execution runs
    # on the event loop and is the one that unblocks it.
    releaser = await admit(store, "sdk-sync-releaser", "sync-releaser")
    assert (await wait_status(store, releaser, "completed"))["outcome"] == {"result": "opened"}
    record = await wait_status(store, blocker, "completed")

    assert record["outcome"] == {"result": {"released": True, "offMainThread": True}}


# ------------------------------------------------------------ Retry reply


async def test_raise_retry_releases_the_lease_and_is_redelivered_after_the_delay(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-retry-reply", "retry-reply", {"succeedOn": 2, "holdOn": 2})

    released = (await wait_event(store, eid, "released"))[0]
    assert released["token"] == 1
    assert released["detail"]["unacknowledgedDeliveries"] == 1
    # Delivery 2 waits at the gate: the counter still shows the released one.
    await wait_until(lambda: flows.SEEN[eid] == [1, 2], what="second delivery")
    record = await store.history.get(eid)
    assert (record["status"], record["token"], record["unacknowledged_deliveries"]) == (
        "running", 2, 1
    )
    claims = await events_of(store, eid, "claimed")
    assert claims[1]["at"] >= parse_ts(released["detail"]["redeliverAfter"])
    assert not await events_of(store, eid, "acknowledged")

    flows.gate(eid).set()
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": {"attempt": 2}}
    assert record["unacknowledged_deliveries"] == 0
    assert await kinds_ignoring_late_renewals(store, eid) == [
        "admitted", "claimed", "released", "claimed", "acknowledged"
    ]


# ---------------------------------------------------------- failure, result


async def test_uncaught_exception_fails_with_name_and_message_and_traceback_in_events(
    store, workers
):
    await workers.start()
    eid = await admit(store, "sdk-boom", "boom")

    record = await wait_status(store, eid, "failed")

    assert record["outcome"] == {"error": {"name": "Boom", "message": "kaboom"}}
    acked = await events_of(store, eid, "acknowledged")
    assert len(acked) == 1 and acked[0]["detail"]["status"] == "failed"
    tb = acked[0]["detail"]["traceback"]
    assert "Traceback" in tb and "explode" in tb and "Boom: kaboom" in tb
    assert flows.calls(eid, "body") == 1  # a failure is an outcome: not redelivered


async def test_uncaught_oserror_in_workflow_code_fails_the_execution(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-oserror", "oserror")

    record = await wait_status(store, eid, "failed", timeout=4)

    assert record["outcome"]["error"]["name"] == "FileNotFoundError"
    assert flows.calls(eid, "body") == 1


async def test_returning_completes_with_the_result(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-return", "returns", {"x": [1, "two", None]})

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {"result": {
        "answer": 42,
        "params": {"x": [1, "two", None]},
        "executionId": eid,
        "workflowId": "sdk-return",
        "paramsIsCtxParams": True,
    }}
    acked = await events_of(store, eid, "acknowledged")
    assert len(acked) == 1 and acked[0]["detail"]["status"] == "completed"
    assert "traceback" not in acked[0]["detail"]
    assert record["unacknowledged_deliveries"] == 0 and record["due_at"] is None


async def test_declared_params_model_is_parsed_for_workflow_code(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-params-model", "params-model", {"order_id": 7})

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {
        "result": {"type": "Order", "orderId": 7, "note": "none", "ctxParams": True}
    }


# ------------------------------------------------------------------ context


async def test_ctx_attempt_equals_the_delivery_count(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-retry-reply", "attempts", {"succeedOn": 3})

    record = await wait_status(store, eid, "completed")

    assert flows.SEEN[eid] == [1, 2, 3]
    assert record["outcome"] == {"result": {"attempt": 3}}
    assert [e["token"] for e in await events_of(store, eid, "claimed")] == [1, 2, 3]


async def test_ctx_context_is_read_only(store, workers):
    await workers.start()
    context = {"tenant": "acme", "region": "eu"}
    eid = await admit(store, "sdk-context", "context", context=context)

    record = await wait_status(store, eid, "completed")

    assert record["outcome"] == {
        "result": {"context": context, "mutated": False, "deleted": False}
    }
    assert record["context"] == context
