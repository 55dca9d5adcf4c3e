"""`fencepost queues list|show|set|pause|resume` and `executions start`'s
flow-control options, run as a subprocess against a live API process."""

from __future__ import annotations

import pytest

from app.queues import Queue
from app.registry import load_workflows
from app.sdk import WorkflowContext, workflow
from tests.cli.test_executions import api_json, block, lines

pytestmark = pytest.mark.timeout(180)


@workflow("cliq-charge", queue=Queue("cliq-payments", concurrency=5, rate_limit=(100, 60)),
          concurrency_key="customer")
async def cliq_charge(ctx: WorkflowContext, params) -> None:
    return None


@pytest.fixture
def flows():
    return load_workflows(["tests.cli.flows", __name__])


def head(text: str) -> dict[str, str]:
    """The `key: value` block above the changes table."""
    return block(text.split("\n\n")[0])


async def test_list_and_show_a_declared_queue(fencepost) -> None:
    run = await fencepost("queues", "list")
    assert run.rc == 0, run
    rows = lines(run.out)
    assert rows[0][:4] == ["QUEUE", "CONCURRENCY", "PER KEY", "RATE"], run
    assert ["cliq-payments", "5", "-", "100/60s", "no", "0", "0", "-"] in rows, run
    run = await fencepost("queues", "show", "cliq-payments")
    assert run.rc == 0, run
    got = head(run.out)
    assert got["concurrency"] == "5 (declared)", run
    assert got["rateLimit"] == "100/60s (declared)", run
    assert got["paused"] == "no", run
    run = await fencepost("queues", "list", "--json")
    assert {q["name"] for q in run.json()["queues"]} == {"cliq-payments", "default"}, run


async def test_set_overrides_and_reset_brings_the_declared_setting_back(fencepost) -> None:
    run = await fencepost("queues", "set", "cliq-payments", "--concurrency", "2",
                          "--per-key-concurrency", "1", "--hold-while-suspended")
    assert run.rc == 0, run
    got = head(run.out)
    assert got["concurrency"] == "2 (run time; declared 5)", run
    assert got["perKeyConcurrency"] == "1 (run time; declared -)", run
    assert got["holdWhileSuspended"] == "yes (run time; declared no)", run
    run = await fencepost("queues", "set", "cliq-payments", "--rate-per-key")
    assert run.rc == 0, run
    assert head(run.out)["rateLimit"] == "100/60s per key (run time; declared 100/60s)", run
    run = await fencepost("queues", "set", "cliq-payments", "--rate-limit", "none",
                          "--concurrency", "none", "--json")
    assert run.rc == 0, run
    assert run.json()["effective"]["rateLimit"] is None, run
    assert run.json()["effective"]["concurrency"] is None, run
    run = await fencepost("queues", "set", "cliq-payments", "--reset", "concurrency",
                          "--reset", "rate-limit", "--reset", "hold-while-suspended", "--json")
    assert run.rc == 0, run
    q = run.json()
    assert q["override"] == {"perKeyConcurrency": 1}, run
    assert q["effective"]["concurrency"] == 5, run
    assert q["effective"]["rateLimit"] == {"limit": 100, "periodSeconds": 60.0,
                                           "perKey": False}, run
    assert [c["change"]["reset"] for c in q["changes"][:1]] == [
        ["concurrency", "rateLimit", "holdWhileSuspended"]], run


async def test_pause_and_resume(fencepost, server) -> None:
    run = await fencepost("queues", "pause", "cliq-payments")
    assert run.rc == 0 and head(run.out)["paused"] == "yes (run time)", run
    assert "CHANGED AT" in run.out, run
    assert (await api_json(server, "/v1/queues/cliq-payments"))["effective"]["paused"]
    run = await fencepost("queues", "resume", "cliq-payments")
    assert run.rc == 0 and head(run.out)["paused"] == "no (run time)", run


@pytest.mark.parametrize(("args", "rc", "says"), [
    (("queues", "show", "nowhere"), 1, "QUEUE_NOT_FOUND"),
    (("queues", "pause", "nowhere"), 1, "QUEUE_NOT_FOUND"),
    (("queues", "set", "cliq-payments"), 2, "give a setting to change"),
    (("queues", "set", "cliq-payments", "--concurrency", "0"), 2, "whole number from 1"),
    (("queues", "set", "cliq-payments", "--rate-limit", "10"), 2, "STARTS/SECONDS"),
    (("queues", "set", "default", "--rate-per-key"), 2, "has no rate limit"),
    (("queues", "set", "cliq-payments", "--rate-limit", "none", "--rate-per-key"), 2,
     "--rate-per-key goes with a rate limit"),
    (("queues", "set", "bad name", "--concurrency", "1"), 1, "INVALID_QUEUE_SETTINGS"),
    (("queues", "set", "q", "--reset", "speed"), 2, "invalid choice"),
])
async def test_refusals_say_what_to_do(fencepost, args, rc, says) -> None:
    run = await fencepost(*args)
    assert run.rc == rc and says in run.err, run


async def test_start_with_priority_delay_and_key(fencepost, server) -> None:
    run = await fencepost("executions", "start", "cliq-charge", "--id", "o1", "--params",
                          '{"customer": "acme"}', "--priority", "-3", "--delay", "600")
    assert run.rc == 0, run
    run = await fencepost("executions", "start", "cliq-charge", "--id", "o2",
                          "--start-at", "2099-01-01T00:00:00Z", "--concurrency-key", "t-9")
    assert run.rc == 0, run
    o1 = await api_json(server, "/v1/executions/o1")
    o2 = await api_json(server, "/v1/executions/o2")
    assert (o1["queue"], o1["concurrencyKey"], o1["priority"]) == ("cliq-payments", "acme", -3)
    assert o1["dueAt"] > o1["admittedAt"]
    assert (o2["concurrencyKey"], o2["dueAt"][:10]) == ("t-9", "2099-01-01")
    run = await fencepost("executions", "start", "cliq-charge", "--delay", "1",
                          "--start-at", "2099-01-01T00:00:00Z")
    assert run.rc == 2 and "not allowed with" in run.err, run
