"""`fencepost operations create|get|cancel` against the live bulk API, carried
out by real workers: dry run, a cancel by filter to completion, a cancelled
operation, per-execution failures, refusals."""

from __future__ import annotations

import httpx
import pytest

from tests.cli.test_executions import block, lines
from tests.cli.test_operator import events, parked_effect
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


async def admit(server, *eids: str) -> None:
    async with httpx.AsyncClient(base_url=server.base) as c:
        for eid in eids:
            r = await c.post("/v1/executions", json={"workflowId": "cli-approval",
                                                     "executionId": eid})
            assert r.status_code == 201, r.text


async def finished(server, operation_id: str, timeout: float = 30) -> dict:
    async with httpx.AsyncClient(base_url=server.base) as c:
        async def ended() -> dict | None:
            record = (await c.get(f"/v1/operations/{operation_id}")).json()
            return record if record["status"] != "running" else None

        return await wait_until(ended, timeout=timeout, interval=0.05,
                                what=f"operation {operation_id} to end")


@pytest.fixture(autouse=True)
def bulk_api(server):
    if "/v1/operations" not in server.app.openapi()["paths"]:
        pytest.skip("POST /v1/operations is not served by this build")


async def test_dry_run_then_cancel_by_filter_to_completion(server, workers, fencepost):
    await admit(server, "bulk-1", "bulk-2", "bulk-3")
    run = await fencepost("operations", "create", "--action", "cancel",
                          "--workflow", "cli-approval", "--dry-run")
    assert run.rc == 0, run
    got = block(run.out)
    assert (got["dryRun"], got["matched"]) == ("yes", "3"), run
    assert sorted(got["sample"].split(",")) == ["bulk-1", "bulk-2", "bulk-3"], run
    run = await fencepost("operations", "create", "--action", "cancel",
                          "--ids", "bulk-1,bulk-3", "--dry-run", "--json")
    assert run.rc == 0 and run.json()["matched"] == 2, run

    await workers.start()
    run = await fencepost("operations", "create", "--action", "cancel",
                          "--workflow", "cli-approval", "--reason", "incident 7", "--json")
    assert run.rc == 0, run
    created = run.json()
    assert (created["action"], created["matched"], created["reason"]) == (
        "cancel", 3, "incident 7"), run
    assert created["filter"] == {"workflowId": "cli-approval"}, run
    await finished(server, created["operationId"])

    run = await fencepost("operations", "get", created["operationId"])
    assert run.rc == 0, run
    got = block(run.out)
    assert (got["status"], got["matched"], got["done"], got["failed"]) == (
        "completed", "3", "3", "0"), run
    for eid in ("bulk-1", "bulk-2", "bulk-3"):
        run = await fencepost("executions", "get", eid, "--wait", "30", "--json")
        assert run.json()["status"] == "cancelled", run


async def test_failures_cancel_and_refusals(server, workers, fencepost):
    await admit(server, "idle-1", "idle-2")
    # Not parked: resume fails per execution, the operation completes with the failures.
    await workers.start()
    run = await fencepost("operations", "create", "--action", "resume",
                          "--ids", "idle-1,idle-2", "--json")
    assert run.rc == 0 and run.json()["matched"] == 2, run
    await finished(server, run.json()["operationId"])
    run = await fencepost("operations", "get", run.json()["operationId"])
    assert run.rc == 0, run
    head, _, failures = run.out.partition("\n\n")
    assert (block(head)["done"], block(head)["failed"]) == ("0", "2"), run
    rows = lines(failures)
    assert rows[0] == ["FAILED EXECUTION", "CODE", "MESSAGE"], run
    assert sorted((r[0], r[1]) for r in rows[1:]) == [
        ("idle-1", "EXECUTION_NOT_PARKED"), ("idle-2", "EXECUTION_NOT_PARKED")], run

    # Cancelled before the workers reach it (none runs now): nothing is done.
    await workers.stop_all()
    run = await fencepost("operations", "create", "--action", "cancel", "--ids", "idle-1",
                          "--json")
    operation_id = run.json()["operationId"]
    run = await fencepost("operations", "cancel", operation_id, "--by", "carol", "--json")
    assert run.rc == 0 and run.json()["status"] == "cancelled" and run.json()["done"] == 0, run
    run = await fencepost("operations", "cancel", operation_id)
    assert run.rc == 1 and run.err.startswith("error: OPERATION_FINISHED: "), run
    run = await fencepost("executions", "get", "idle-1", "--json")
    assert run.json()["status"] != "cancelled", run

    run = await fencepost("operations", "get", "op-0000000000000000")
    assert run.rc == 1 and run.err.startswith("error: OPERATION_NOT_FOUND: "), run
    run = await fencepost("operations", "create", "--action", "cancel")  # no filter
    assert run.rc == 1 and run.err.startswith("error: INVALID_REQUEST: filter: "), run


async def test_bulk_resolve_records_the_given_result(server, workers, store, fencepost):
    for eid in ("remote-1", "remote-2"):
        await parked_effect(store, eid)
    await workers.start()
    run = await fencepost("operations", "create", "--action", "resolve", "--workflow",
                          "cli-remote", "--status", "parked", "--succeed", '{"receipt": 1}',
                          "--by", "dave", "--json")
    assert run.rc == 0 and run.json()["matched"] == 2, run
    record = await finished(server, run.json()["operationId"])
    assert (record["done"], record["failed"]) == (2, 0), record
    for eid in ("remote-1", "remote-2"):
        [resolved] = [e["detail"] for e in await events(server, eid) if e["kind"] == "resolved"]
        assert (resolved["action"], resolved["result"]) == ("succeed", {"receipt": 1}), resolved
