"""app.client (issue 14 item 3): Client and AsyncClient against the live
service (a real uvicorn serving the app) with real in-process workers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from app.client import (
    AsyncClient,
    Client,
    DatabaseUnavailable,
    ExecutionCancelled,
    ExecutionFailed,
    ExecutionIdConflict,
    ExecutionNotFound,
    ExecutionTerminal,
    ExecutionTimedOut,
    FencepostError,
    InvalidRequest,
    Started,
    WaitTimeout,
)


async def test_start_and_wait_for_the_result(server, workers):
    await workers.start()
    async with AsyncClient(server.base) as fp:
        started = await fp.start("client-echo", {"order": 42}, execution_id="order-42")
        assert started == Started("order-42", "admitted", True, None)
        assert await fp.result("order-42", timeout=30) == {"order": 42}
        assert (await fp.get("order-42"))["status"] == "completed"


async def test_the_sync_client_does_the_same(server, workers):
    await workers.start()

    def use() -> tuple[Started, object, dict]:
        with Client(server.base, timeout=10) as fp:
            started = fp.start("client-echo", [1, "two"], timeout_seconds=60,
                               context={"caller": "sync"})
            return started, fp.result(started.execution_id, timeout=30), fp.get(
                started.execution_id)

    started, result, record = await asyncio.to_thread(use)
    assert started.created and started.status == "admitted"
    assert result == [1, "two"]
    assert record["context"] == {"caller": "sync"} and record["deadline"] is not None


async def test_idempotent_start_and_the_conflict_error(server):
    async with AsyncClient(server.base) as fp:
        first = await fp.start("client-echo", {"n": 1}, execution_id="same", if_exists="return")
        again = await fp.start("client-echo", {"n": 1}, execution_id="same", if_exists="return")
        with pytest.raises(ExecutionIdConflict) as conflict:
            await fp.start("client-echo", {"n": 2}, execution_id="same", if_exists="return")
        with pytest.raises(ExecutionIdConflict):
            await fp.start("client-echo", {"n": 1}, execution_id="same")
    assert first.created and not again.created
    assert again.execution_id == "same" and again.record is not None
    assert again.record["params"] == {"n": 1}
    error = conflict.value
    assert isinstance(error, FencepostError)
    assert error.code == "EXECUTION_ID_CONFLICT" and error.status_code == 409
    assert "IDs are never reused" in error.message
    assert error.details["executionId"] == "same"


async def test_a_failed_execution_raises_execution_failed(server, workers):
    await workers.start()
    async with AsyncClient(server.base) as fp:
        started = await fp.start("client-boom")
        with pytest.raises(ExecutionFailed) as failed:
            await fp.result(started.execution_id, timeout=30)
    assert "the order was refused" in (failed.value.error_message or "")
    assert failed.value.record["status"] == "failed"
    assert failed.value.execution_id == started.execution_id


async def test_wait_timeout_then_a_signal_completes_it(server, workers):
    await workers.start()
    async with AsyncClient(server.base) as fp:
        started = await fp.start("client-approval")
        begun = time.monotonic()
        with pytest.raises(WaitTimeout) as waited:
            await fp.result(started.execution_id, timeout=1.0)
        elapsed = time.monotonic() - begun
        assert waited.value.record["status"] in ("admitted", "running", "suspended")
        assert isinstance(waited.value, TimeoutError)
        assert 1.0 <= elapsed < 4, elapsed
        assert (await fp.signal(started.execution_id, "approve", True)) == {"status": "received"}
        assert await fp.result(started.execution_id, timeout=30) == {"approved": True}


async def test_cancel_and_deadline_raise_their_errors(server, workers):
    await workers.start()
    async with AsyncClient(server.base) as fp:
        cancelled = await fp.start("client-approval")
        assert (await fp.cancel(cancelled.execution_id, by="test"))["status"] in (
            "cancelled", "suspended", "running", "admitted")
        with pytest.raises(ExecutionCancelled):
            await fp.result(cancelled.execution_id, timeout=30)
        late = await fp.start("client-approval", timeout_seconds=0.5)
        with pytest.raises(ExecutionTimedOut):
            await fp.result(late.execution_id, timeout=30)
        terminated = await fp.start("client-approval")
        await fp.terminate(terminated.execution_id)
        with pytest.raises(ExecutionCancelled):
            await fp.result(terminated.execution_id, timeout=30)
        with pytest.raises(ExecutionTerminal) as terminal:
            await fp.cancel(terminated.execution_id)
    assert terminal.value.status_code == 409


async def test_errors_are_named_after_their_codes(server):
    async with AsyncClient(server.base) as fp:
        with pytest.raises(ExecutionNotFound) as missing:
            await fp.get("nobody")
        with pytest.raises(ExecutionNotFound):
            await fp.result("nobody", timeout=5)
        with pytest.raises(InvalidRequest) as invalid:
            await fp.start("client-echo", execution_id="bad id with spaces")
        with pytest.raises(FencepostError) as unknown_workflow:
            await fp.start("no-such-workflow")
    assert missing.value.code == "EXECUTION_NOT_FOUND" and missing.value.status_code == 404
    assert invalid.value.status_code == 422
    assert unknown_workflow.value.code == "WORKFLOW_NOT_FOUND"
    assert type(unknown_workflow.value).__name__ == "WorkflowNotFound"


async def test_list_iterates_over_pages_and_events_reads_the_history(server, workers):
    async with AsyncClient(server.base) as fp:
        for n in range(7):
            await fp.start("client-echo", {"n": n}, execution_id=f"page-{n}")
        await fp.start("client-boom", execution_id="other")
        listed = [e["executionId"] async for e in fp.list(workflow_id="client-echo", limit=3)]
        await workers.start()
        await fp.result("page-3", timeout=30)
        events = await fp.events("page-3")
    assert sorted(listed) == [f"page-{n}" for n in range(7)]
    assert len(listed) == 7
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "admitted" and len(kinds) >= 3

    def sync_list() -> list[str]:
        with Client(server.base) as fp:
            return [e["executionId"] for e in fp.list(status="completed", limit=1)]
    assert "page-3" in await asyncio.to_thread(sync_list)


async def test_history_reads_what_the_replay_check_reads(server, workers):
    async with AsyncClient(server.base) as fp:
        await fp.start("client-echo", {"n": 1}, execution_id="hist-1")
        await workers.start()
        await fp.result("hist-1", timeout=30)
        history = await fp.history("hist-1")
    assert (history["format"], history["executionId"], history["status"]) == (
        "fencepost-history/1", "hist-1", "completed")

    def sync_history() -> dict:
        with Client(server.base) as fp:
            return fp.history("hist-1")
    assert await asyncio.to_thread(sync_history) == history


class Unavailable:
    """An ASGI wrap: the first `times` requests are answered as the API answers
    when its database is down (503 DATABASE_UNAVAILABLE with Retry-After)."""

    def __init__(self, app, times: int, retry_after: str = "0.3"):
        self.app, self.times, self.retry_after, self.seen = app, times, retry_after, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.seen >= self.times:
            return await self.app(scope, receive, send)
        self.seen += 1
        body = json.dumps({"error": {"code": "DATABASE_UNAVAILABLE",
                                     "message": "the database is unavailable; retry"}}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"),
                                (b"retry-after", self.retry_after.encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("times, retries, succeeds", [(2, 3, True), (10, 2, False)])
async def test_503_is_retried_after_retry_after_bounded(make_server, flows, times, retries,
                                                         succeeds):
    wraps: list[Unavailable] = []
    srv = await make_server(workflows=flows,
                            wrap=lambda app: wraps.append(Unavailable(app, times)) or wraps[-1])
    async with AsyncClient(srv.base, retries_503=retries) as fp:
        begun = time.monotonic()
        if succeeds:
            assert (await fp.start("client-echo")).created
        else:
            with pytest.raises(DatabaseUnavailable) as unavailable:
                await fp.start("client-echo")
            assert unavailable.value.status_code == 503
        elapsed = time.monotonic() - begun
    refused = times if succeeds else retries + 1
    assert wraps[0].seen == refused
    # Each refusal but the last one given up on was followed by its Retry-After.
    assert elapsed >= 0.3 * min(times, retries) * 0.95, elapsed


def test_every_error_code_the_api_documents_has_its_class():
    from app.api.app import create_app
    from app.client import ERRORS_BY_CODE
    from app.settings import Settings
    from tests.hostile.test_documented_statuses import documented_codes

    schema = create_app(Settings(database_url="postgresql://unused/none", workflows="")).openapi()
    codes = {code for ops in schema["paths"].values() for op in ops.values()
             for answer in op.get("responses", {}).values()
             for code in documented_codes(answer.get("description", ""))}
    assert "EXECUTION_ID_CONFLICT" in codes
    missing = sorted(codes - set(ERRORS_BY_CODE))
    assert not missing, f"app/client.py has no exception class for {missing}"
    for code, cls in ERRORS_BY_CODE.items():
        assert cls.__name__ == "".join(w.capitalize() for w in code.split("_")), (code, cls)


async def test_redrive_and_fork_after_the_fix(server, workers):
    from tests.client import flows

    if "/v1/executions/{execution_id}/redrive" not in server.app.openapi()["paths"]:
        pytest.skip("POST /v1/executions/{id}/redrive and /fork are not served by this build")
    await workers.start()
    flows.FLAKY["broken"] = True
    try:
        async with AsyncClient(server.base) as fp:
            await fp.start("client-flaky", 7, execution_id="flaky-7")
            with pytest.raises(ExecutionFailed):
                await fp.result("flaky-7", timeout=30)
            await fp.start("client-flaky", 8, execution_id="flaky-8")
            with pytest.raises(ExecutionFailed):
                await fp.result("flaky-8", timeout=30)
            flows.FLAKY["broken"] = False
            redriven = await fp.redrive("flaky-7", reason="provider is back")
            assert redriven["executionId"] == "flaky-7"
            assert await fp.result("flaky-7", timeout=30) == {"charged": 7}
            forked = await fp.fork("flaky-8", "charge", execution_id="flaky-8-again")
            assert forked["executionId"] == "flaky-8-again"
            assert forked["forkedFrom"] == "flaky-8"
            assert await fp.result("flaky-8-again", timeout=30) == {"charged": 8}
            # Completed, so nothing failed to start again from: the step must be named.
            with pytest.raises(FencepostError) as completed:
                await fp.redrive("flaky-7")
    finally:
        flows.FLAKY["broken"] = False
    assert type(completed.value).__name__ == "".join(
        w.capitalize() for w in completed.value.code.split("_"))
