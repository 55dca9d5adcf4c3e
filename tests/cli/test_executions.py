"""`fencepost executions ...` against a live service with real workers: every
subcommand, its table or block, its --json (the API's own answer), its refusals."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.cli import flows
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def lines(text: str) -> list[list[str]]:
    """A table's rows as lists of cells (cells are separated by 2+ spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def block(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


async def api_json(server, path: str, **params) -> dict:
    async with httpx.AsyncClient(base_url=server.base, timeout=30) as c:
        r = await c.get(path, params=params)
        assert r.status_code == 200, r.text
        return r.json()


async def suspended(server, *eids: str, timeout: float = 30) -> None:
    async with httpx.AsyncClient(base_url=server.base) as c:
        async def all_suspended() -> bool:
            records = [(await c.get(f"/v1/executions/{eid}")).json() for eid in eids]
            return all(r["status"] == "suspended" for r in records)

        await wait_until(all_suspended, timeout=timeout, interval=0.05,
                         what=f"{eids} suspended")


async def test_start_get_list_events_and_steps(server, workers, fencepost):
    await workers.start()
    run = await fencepost("executions", "start", "cli-echo", "--id", "order-1",
                          "--params", '{"order": 1}')
    assert run.rc == 0, run
    assert block(run.out) == {"executionId": "order-1", "status": "admitted", "created": "yes"}
    # The same admission again, idempotent: the existing record, exit 0.
    run = await fencepost("executions", "start", "cli-echo", "--id", "order-1",
                          "--params", '{"order": 1}', "--if-exists", "return", "--json")
    assert run.rc == 0, run
    assert run.json()["executionId"] == "order-1" and run.json()["params"] == {"order": 1}

    run = await fencepost("executions", "get", "order-1", "--wait", "30", "--json")
    assert run.rc == 0, run
    assert run.json()["status"] == "completed", run
    assert run.json() == await api_json(server, "/v1/executions/order-1")
    run = await fencepost("executions", "get", "order-1")
    assert run.rc == 0, run
    got = block(run.out)
    assert (got["executionId"], got["workflowId"], got["status"]) == (
        "order-1", "cli-echo", "completed"), run
    assert got["outcome"] == '{"result":{"order":1}}', run

    run = await fencepost("executions", "start", "cli-echo", "--id", "order-2", "--json")
    assert run.rc == 0 and run.json() == {"executionId": "order-2", "status": "admitted"}, run
    assert (await fencepost("executions", "get", "order-2", "--wait", "30")).rc == 0

    run = await fencepost("executions", "list", "--workflow", "cli-echo")
    assert run.rc == 0, run
    rows = lines(run.out)
    assert rows[0][:4] == ["EXECUTION ID", "WORKFLOW", "STATUS", "ADMITTED"], run
    assert sorted((r[0], r[1], r[2]) for r in rows[1:]) == [
        ("order-1", "cli-echo", "completed"), ("order-2", "cli-echo", "completed")], run
    run = await fencepost("executions", "list", "--status", "completed", "--limit", "1")
    assert run.rc == 0 and len(lines(run.out)) == 2, run
    assert "--all" in run.err, run  # says there are more
    run = await fencepost("executions", "list", "--limit", "1", "--json")
    assert run.rc == 0 and len(run.json()["executions"]) == 1, run
    assert run.json()["nextCursor"], run
    run = await fencepost("executions", "list", "--all", "--status", "completed", "--json")
    assert run.rc == 0, run
    assert sorted(e["executionId"] for e in run.json()["executions"]) == ["order-1", "order-2"]
    run = await fencepost("executions", "list", "--status", "failed")
    assert run.rc == 0 and len(lines(run.out)) == 1, run  # the header only

    run = await fencepost("executions", "events", "order-1")
    assert run.rc == 0, run
    rows = lines(run.out)
    assert rows[0] == ["EVENT", "AT", "KIND", "TOKEN", "DETAIL"], run
    api_events = (await api_json(server, "/v1/executions/order-1/events"))["events"]
    assert [r[2] for r in rows[1:]] == [e["kind"] for e in api_events], run
    run = await fencepost("executions", "events", "order-1", "--json")
    assert run.rc == 0 and run.json()["events"] == api_events, run

    run = await fencepost("executions", "steps", "order-1", "--values")
    assert run.rc == 0, run
    rows = lines(run.out)
    assert rows[0][:2] == ["STEP", "STATUS"] and rows[0][-2:] == ["RESULT", "ERROR"], run
    assert rows[1][0] == "echo" and rows[1][-2:] == ['{"order":1}', "-"], run
    run = await fencepost("executions", "steps", "order-1", "--json")
    assert run.rc == 0, run
    assert run.json()["steps"] == (await api_json(server, "/v1/executions/order-1/steps"))[
        "steps"]
    assert "result" not in run.json()["steps"][0]  # values only with --values


async def test_signal_cancel_and_terminate(server, workers, fencepost):
    await workers.start()
    for eid in ("approve-1", "approve-2", "approve-3"):
        assert (await fencepost("executions", "start", "cli-approval", "--id", eid)).rc == 0

    await suspended(server, "approve-1", "approve-2", "approve-3")
    run = await fencepost("executions", "list", "--workflow", "cli-approval")
    assert run.rc == 0, run
    assert sorted((r[0], r[2], r[-1]) for r in lines(run.out)[1:]) == [
        (eid, "suspended", "waiting-for-signal approve")
        for eid in ("approve-1", "approve-2", "approve-3")], run

    run = await fencepost("executions", "signal", "approve-1", "approve", "true")
    assert run.rc == 0 and block(run.out) == {"status": "received"}, run
    run = await fencepost("executions", "get", "approve-1", "--wait", "30", "--json")
    assert run.json()["outcome"] == {"result": {"approved": True}}, run

    run = await fencepost("executions", "cancel", "approve-2", "--by", "alice", "--json")
    assert run.rc == 0 and set(run.json()) == {"status"}, run
    run = await fencepost("executions", "get", "approve-2", "--wait", "30", "--json")
    assert run.json()["status"] == "cancelled", run
    cancelled = [e for e in (await fencepost("executions", "events", "approve-2", "--json"))
                 .json()["events"] if e["kind"] == "cancel_requested"]
    assert cancelled and cancelled[0]["detail"]["by"] == "alice", cancelled

    run = await fencepost("executions", "terminate", "approve-3")
    assert run.rc == 0 and block(run.out)["status"] == "cancelled", run

    # The API said no: exit 1 and its code.
    run = await fencepost("executions", "cancel", "approve-3")
    assert run.rc == 1 and run.out == "", run
    assert run.err.startswith("error: EXECUTION_TERMINAL: execution 'approve-3' already "
                              "ended"), run
    run = await fencepost("executions", "signal", "nobody", "approve")
    assert run.rc == 1 and run.err.startswith("error: EXECUTION_NOT_FOUND: "), run


async def test_redrive_and_fork(server, workers, fencepost):
    if "/v1/executions/{execution_id}/redrive" not in server.app.openapi()["paths"]:
        pytest.skip("POST /v1/executions/{id}/redrive and /fork are not served by this build")
    await workers.start()
    for eid, order in (("flaky-7", 7), ("flaky-8", 8)):
        assert (await fencepost("executions", "start", "cli-flaky", "--id", eid,
                                "--params", str(order))).rc == 0
        run = await fencepost("executions", "get", eid, "--wait", "30", "--json")
        assert run.json()["status"] == "failed", run

    flows.BROKEN["charge"] = False
    run = await fencepost("executions", "redrive", "flaky-7", "--reason", "provider is back")
    assert run.rc == 0, run
    assert block(run.out) | {"status": "-"} == {
        "executionId": "flaky-7", "status": "-", "redrive": "1", "superseded": "charge"}, run
    run = await fencepost("executions", "get", "flaky-7", "--wait", "30", "--json")
    assert run.json()["outcome"] == {"result": {"charged": 7}}, run
    rows = lines((await fencepost("executions", "steps", "flaky-7")).out)
    assert [(r[0], r[1], r[-1]) for r in rows[1:]] == [
        ("load", "completed", "-"), ("charge", "completed", "-"),
        ("charge", "superseded", "RuntimeError")], rows

    run = await fencepost("executions", "fork", "flaky-8", "--from-step", "charge",
                          "--id", "flaky-8-again", "--params", "9", "--json")
    assert run.rc == 0, run
    assert (run.json()["executionId"], run.json()["forkedFrom"], run.json()["copied"]) == (
        "flaky-8-again", "flaky-8", ["load"]), run
    run = await fencepost("executions", "get", "flaky-8-again", "--wait", "30", "--json")
    # "load" was copied (its recorded value 8), only "charge" ran again.
    assert run.json()["outcome"] == {"result": {"charged": 8}}, run

    # Completed: nothing failed to start from, so the step must be named.
    run = await fencepost("executions", "redrive", "flaky-7")
    assert run.rc == 1 and run.err.startswith("error: REDRIVE_NEEDS_FROM_STEP: "), run
    run = await fencepost("executions", "redrive", "flaky-7", "--from-step", "charge",
                          "--timeout", "600", "--json")
    assert run.rc == 0, run
    assert (run.json()["redrive"], run.json()["superseded"]) == (2, ["charge"]), run
    record = (await fencepost("executions", "get", "flaky-7", "--wait", "30", "--json")).json()
    assert record["status"] == "completed" and record["deadline"] is not None, record
    run = await fencepost("executions", "fork", "flaky-7", "--from-step", "nope")
    assert run.rc == 1 and run.err.startswith("error: STEP_NOT_FOUND: "), run
