"""Queues and concurrency keys as code declares them: checked at import,
and each execution's key found from its params the same way everywhere."""

from __future__ import annotations

import pytest

from app.queues import Queue, QueueSettingsError
from app.registry import WorkflowRegistrationError, declared_queues, workflow


async def noop(ctx, params):
    return None


def test_a_workflow_is_on_the_default_queue_unless_it_names_one():
    plain = workflow("decl-plain")(noop)
    assert plain is noop
    from app.registry import _registry
    assert _registry["decl-plain"].queue.name == "default"
    workflow("decl-named", queue="reports")(noop)
    assert _registry["decl-named"].queue.name == "reports"
    # A queue named only by a string declares no settings (they come from run time).
    assert [q.name for q in declared_queues({"decl-named": _registry["decl-named"]})] == []


def test_declared_queues_are_collected_once_per_name():
    from app.registry import _registry
    payments = Queue("decl-payments", concurrency=5, rate_limit=(100, 60))
    workflow("decl-charge", queue=payments)(noop)
    workflow("decl-refund", queue=payments)(noop)
    found = declared_queues({w: _registry[w] for w in ("decl-charge", "decl-refund")})
    assert found == [payments]
    assert payments.settings() == {
        "concurrency": 5, "per_key_concurrency": None, "rate_limit": 100, "rate_period": 60,
        "rate_per_key": False, "hold_while_suspended": False}


def test_one_queue_name_with_two_different_declarations_fails_at_import():
    workflow("decl-a", queue=Queue("decl-twice", concurrency=1))(noop)
    with pytest.raises(WorkflowRegistrationError) as info:
        workflow("decl-b", queue=Queue("decl-twice", concurrency=2))(noop)
    assert "declared twice" in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"concurrency": 0}, "concurrency must be an integer from 1"),
    ({"per_key_concurrency": True}, "per_key_concurrency must be an integer"),
    ({"rate_limit": (10, 0)}, "rate_period must be a number of seconds from 0.001"),
    ({"rate_limit": (10, 1e-7)}, "rate_period must be a number of seconds from 0.001"),
    ({"rate_limit": 10}, "must be (starts, period_seconds)"),
])
def test_bad_queue_settings_fail_where_they_are_declared(kwargs, message):
    with pytest.raises(QueueSettingsError) as info:
        Queue("decl-bad", **kwargs)
    assert message in str(info.value)


def test_a_bad_queue_name_fails_at_import():
    with pytest.raises(WorkflowRegistrationError) as info:
        workflow("decl-badname", queue="no spaces")(noop)
    assert "queue= of 'decl-badname'" in str(info.value)


def test_the_concurrency_key_from_a_field_or_a_function():
    from app.registry import _registry
    workflow("decl-field", concurrency_key="customerId")(noop)
    workflow("decl-fn", concurrency_key=lambda p: p["tenant"]["id"])(noop)
    by_field, by_fn = _registry["decl-field"], _registry["decl-fn"]

    assert by_field.key_of({"customerId": "c-1"}) == "c-1"
    assert by_field.key_of({"customerId": 17}) == "17"
    assert by_field.key_of({}) is None  # no key: no per-key limit
    assert by_fn.key_of({"tenant": {"id": "t-9"}}) == "t-9"
    with pytest.raises(ValueError) as info:
        by_fn.key_of({})
    assert "concurrency_key function of 'decl-fn' raised KeyError" in str(info.value)
    with pytest.raises(ValueError) as info:
        by_field.key_of({"customerId": {"nested": 1}})
    assert "must be a string or an integer" in str(info.value)
