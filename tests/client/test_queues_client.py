"""app.client's queue methods and admission's flow-control arguments,
against a real uvicorn serving the app."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from app.client import (
    AsyncClient,
    Client,
    InvalidConcurrencyKey,
    InvalidQueueSettings,
    QueueNotFound,
)
from app.queues import Queue
from app.registry import load_workflows
from app.sdk import WorkflowContext, workflow


@workflow("cq-charge", queue=Queue("cq-payments", concurrency=3), concurrency_key="customer")
async def cq_charge(ctx: WorkflowContext, params) -> None:
    return None


@pytest.fixture
async def queue_server(make_server):
    return await make_server(workflows=load_workflows([__name__]))


async def test_start_takes_priority_a_start_time_and_a_key(queue_server) -> None:
    async with AsyncClient(queue_server.base) as fp:
        await fp.start("cq-charge", {"customer": "acme"}, execution_id="a", priority=-5,
                       start_at=datetime(2099, 1, 1, tzinfo=UTC))
        await fp.start("cq-charge", {"customer": "acme"}, execution_id="b",
                       delay_seconds=60, concurrency_key="tenant-1")
        a, b = await fp.get("a"), await fp.get("b")
        with pytest.raises(InvalidConcurrencyKey):
            await fp.start("cq-charge", {"customer": [1]})
    assert (a["queue"], a["concurrencyKey"], a["priority"]) == ("cq-payments", "acme", -5)
    assert datetime.fromisoformat(a["dueAt"]) == datetime(2099, 1, 1, tzinfo=UTC)
    assert b["concurrencyKey"] == "tenant-1" and b["priority"] == 0
    assert datetime.fromisoformat(b["dueAt"]) > datetime.fromisoformat(b["admittedAt"])


async def test_queues_are_read_changed_paused_and_resumed(queue_server) -> None:
    async with AsyncClient(queue_server.base) as fp:
        names = [q["name"] for q in await fp.list_queues()]
        changed = await fp.set_queue("cq-payments", concurrency=None, rate_limit=(10, 1),
                                     rate_per_key=True)
        paused = await fp.pause_queue("cq-payments")
        resumed = await fp.resume_queue("cq-payments")
        reset = await fp.set_queue("cq-payments", reset=["concurrency", "rateLimit"])
        read = await fp.get_queue("cq-payments")
        with pytest.raises(QueueNotFound):
            await fp.get_queue("nowhere")
        with pytest.raises(QueueNotFound):
            await fp.pause_queue("nowhere")
        with pytest.raises(InvalidQueueSettings) as bad:
            await fp.set_queue("cq-payments", concurrency=0)
    assert names == ["cq-payments", "default"]
    assert changed["effective"]["concurrency"] is None
    assert changed["effective"]["rateLimit"] == {"limit": 10, "periodSeconds": 1.0,
                                                 "perKey": True}
    assert paused["effective"]["paused"] and not resumed["effective"]["paused"]
    assert reset["effective"]["concurrency"] == 3 and reset["effective"]["rateLimit"] is None
    assert len(read["changes"]) == 5
    assert "concurrency" in bad.value.message


def test_rate_per_key_goes_with_a_rate_limit() -> None:
    with Client("http://unused.invalid") as fp, pytest.raises(ValueError, match="rate_limit"):
        fp.set_queue("q", rate_per_key=True)


async def test_the_sync_client_does_the_same(queue_server) -> None:
    def use() -> tuple[list, dict, dict]:
        with Client(queue_server.base, timeout=10) as fp:
            fp.start("cq-charge", {"customer": "x"}, execution_id="s1", priority=3,
                     delay_seconds=30)
            changed = fp.set_queue("fresh", per_key_concurrency=2, hold_while_suspended=True)
            fp.pause_queue("fresh")
            fp.resume_queue("fresh")
            return fp.list_queues(), changed, fp.get("s1")

    queues, changed, record = await asyncio.to_thread(use)
    assert [q["name"] for q in queues] == ["cq-payments", "default", "fresh"]
    assert changed["override"] == {"perKeyConcurrency": 2, "holdWhileSuspended": True}
    assert (record["priority"], record["concurrencyKey"]) == (3, "x")


async def test_the_example_shipment_runs_on_its_limited_queue(make_server, client_settings):
    from tests.support.workers import InProcessWorkers

    examples = load_workflows(["app.examples"])
    srv = await make_server(workflows=examples)
    workers = InProcessWorkers(client_settings, examples)
    await workers.start()
    try:
        async with AsyncClient(srv.base) as fp:
            carrier = await fp.get_queue("carrier-api")
            started = await fp.start("book-shipment", {"order_id": 7, "warehouse": "north"})
            booked = await fp.result(started.execution_id, timeout=30)
            record = await fp.get(started.execution_id)
    finally:
        await workers.stop_all()
    assert carrier["effective"] == {
        "concurrency": 2, "perKeyConcurrency": 1,
        "rateLimit": {"limit": 10, "periodSeconds": 1.0, "perKey": False},
        "holdWhileSuspended": False, "paused": False}
    assert booked["trackingNumber"].startswith("TRK") and booked["warehouse"] == "north"
    assert (record["queue"], record["concurrencyKey"]) == ("carrier-api", "north")
