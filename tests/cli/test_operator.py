"""`fencepost executions resolve|resume`, `fencepost workers`, and the exit
codes and configuration (FENCEPOST_URL, FENCEPOST_TOKEN, --url, --token) of
the operator CLI, run as a subprocess against a live server."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys

import httpx
import pytest

from app.api.auth import new_token
from app.store import Admitted, ExecutionStore
from tests.support.api_process import free_port
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.timeout(180)

# Not served by the test workers: what the store leaves it as, it stays.
REMOTE = "cli-remote"


async def admitted(store: ExecutionStore, eid: str, workflow_id: str = REMOTE) -> str:
    answer = await store.admissions.admit(workflow_id=workflow_id, params={}, execution_id=eid)
    assert isinstance(answer, Admitted), answer
    return eid


async def parked_effect(store: ExecutionStore, eid: str) -> None:
    """Parked with step `charge` outcome_unknown (an effect begun, never answered)."""
    await admitted(store, eid)
    [d] = await store.leases.claim_due(1, 30, "w", [REMOTE])
    await store.effects.begin_effect(d.lease, "charge", idempotency_key=f"{eid}:charge",
                             function_name="remote_charge")
    assert await store.effects.park_outcome_unknown(d.lease, "charge") == "parked"


async def parked_poison(pool, eid: str) -> None:
    """Parked as poison: one delivery never acknowledged, with a threshold of one."""
    store = ExecutionStore(pool, redelivery_base_seconds=0.001, redelivery_cap_seconds=0.001,
                           max_unacknowledged_deliveries=1)
    await admitted(store, eid, "cli-poison")  # its own workflow: no other is claimed
    [d] = await store.leases.claim_due(1, 30, "w", ["cli-poison"])
    await store.leases.release(d.lease)
    assert (await store.history.get(eid))["status"] == "parked"


async def events(server, eid: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=server.base) as c:
        return (await c.get(f"/v1/executions/{eid}/events", params={"limit": 1000})).json()[
            "events"]


async def test_resolve_each_way_and_resume(server, store, pool, fencepost):
    for eid in ("pay-ok", "pay-no", "pay-again"):
        await parked_effect(store, eid)

    run = await fencepost("executions", "resolve", "pay-ok", "charge",
                          "--succeed", '{"receipt": "r-1"}', "--by", "alice")
    assert run.rc == 0 and run.out.strip() == "status: admitted", run
    run = await fencepost("executions", "resolve", "pay-no", "charge",
                          "--fail", "CardDeclined: the bank said no", "--json")
    assert run.rc == 0 and run.json() == {"status": "admitted"}, run
    run = await fencepost("executions", "resolve", "pay-again", "charge", "--retry")
    assert run.rc == 0, run
    resolved = {eid: [e["detail"] for e in await events(server, eid) if e["kind"] == "resolved"]
                for eid in ("pay-ok", "pay-no", "pay-again")}
    [ok], [no], [again] = resolved.values()
    assert (ok["action"], ok["result"], ok["by"]) == ("succeed", {"receipt": "r-1"}, "alice"), ok
    assert (no["action"], no["error"]) == (
        "fail", {"name": "CardDeclined", "message": "the bank said no"}), no
    assert again["action"] == "retry", again

    # Settled already: the API says no, exit 1 with its code.
    run = await fencepost("executions", "resolve", "pay-ok", "charge", "--retry")
    assert run.rc == 1 and run.err.startswith("error: STEP_NOT_OUTCOME_UNKNOWN: "), run

    await parked_poison(pool, "poisoned")
    run = await fencepost("executions", "resume", "poisoned", "--by", "bob")
    assert run.rc == 0 and run.out.strip() == "status: admitted", run
    [resumed] = [e for e in await events(server, "poisoned") if e["kind"] == "resumed"]
    assert resumed["detail"]["by"] == "bob", resumed
    run = await fencepost("executions", "resume", "poisoned", "--json")
    assert run.rc == 1 and run.out == "", run
    assert run.err.startswith("error: EXECUTION_NOT_PARKED: execution 'poisoned' is "), run


async def test_workers_table_and_json(server, workers, fencepost):
    worker = await workers.start(concurrency=3)
    run = await fencepost("workers")
    assert run.rc == 0, run
    header, *rows = [line.split() for line in run.out.splitlines()]
    assert header[:4] == ["WORKER", "HOST", "PID", "ALIVE"], run
    assert [(r[0], r[3], r[4]) for r in rows] == [(worker.worker_id, "yes", "3")], run
    assert "cli-echo" in rows[0][-1], run
    run = await fencepost("workers", "--json")
    async with httpx.AsyncClient(base_url=server.base) as c:
        api = (await c.get("/v1/workers")).json()
    def still(answer: dict) -> list[dict]:  # all but the heartbeat, which moves on
        return [{k: v for k, v in w.items() if k != "heartbeatAt"} for w in answer["workers"]]

    assert run.rc == 0 and still(run.json()) == still(api), run


async def test_usage_errors_exit_2(fencepost):
    for args, says in [
        (("executions", "start", "cli-echo", "--params", "{order: 1}"), "not JSON"),
        (("executions", "signal", "x", "approve", "[1,"), "not JSON"),
        (("executions", "resolve", "x", "charge"), "one of the arguments"),
        (("executions", "resolve", "x", "charge", "--retry", "--succeed", "1"), "not allowed"),
        (("executions", "resolve", "x", "charge", "--fail", "no-colon"), "NAME:MESSAGE"),
        (("executions", "fork", "x"), "--from-step"),
        (("executions", "redrive", "x", "--timeout", "-5"), "above 0"),
        (("executions", "list", "--status", "broken"), "invalid choice"),
        (("executions",), "SUBCOMMAND"),
        (("operations", "create"), "--action"),
        (("operations", "create", "--action", "explode"), "invalid choice"),
        (("operations", "create", "--action", "cancel", "--ids", "a", "--from-step", "s"),
         "--from-step goes only with --action redrive"),
        (("operations", "create", "--action", "redrive", "--ids", "a", "--succeed", "null"),
         "--succeed goes only with --action resolve"),
    ]:
        run = await fencepost(*args)
        assert run.rc == 2 and says in run.err and run.out == "", run


async def test_unreachable_or_misconfigured_service_exits_2_naming_fencepost_url(fencepost):
    nobody = f"http://127.0.0.1:{free_port()}"
    run = await fencepost("executions", "list", url=nobody)
    assert run.rc == 2 and run.out == "", run
    [line] = run.err.splitlines()
    assert line.startswith(f"error: cannot reach fencepost at {nobody} (FENCEPOST_URL"), run
    for url in ("localhost:8000", "ftp://example.org", "http://"):
        run = await fencepost("workers", url=url)
        assert run.rc == 2, run
        assert run.err.strip() == (f"error: FENCEPOST_URL (or --url) {url!r} is not an "
                                   "http(s) URL; for example http://127.0.0.1:8000"), run
    # Nothing set: the default, and where it failed.
    run = await fencepost("workers", "--url", nobody, url=None)
    assert run.rc == 2 and nobody in run.err, run


async def test_unknown_execution_is_exit_1_with_the_api_code(fencepost):
    for args in (("get", "ghost"), ("events", "ghost"), ("steps", "ghost"), ("cancel", "ghost"),
                 ("terminate", "ghost"), ("redrive", "ghost"), ("resume", "ghost"),
                 ("fork", "ghost", "--from-step", "a"),
                 ("resolve", "ghost", "a", "--retry")):
        run = await fencepost("executions", *args)
        assert run.rc == 1 and run.out == "", run
        assert run.err.startswith("error: EXECUTION_NOT_FOUND: "), run
    run = await fencepost("executions", "start", "no-such-workflow")
    assert run.rc == 1 and run.err.startswith("error: WORKFLOW_NOT_FOUND: "), run


async def test_token_and_url_from_the_environment_and_flags(make_server, cli_settings, store,
                                                            fencepost):
    secured = await make_server(cli_settings.model_copy(update={"auth": "enabled"}))
    tokens = {}
    for role in ("read", "operate"):
        token_id, tokens[role], digest = new_token()
        await store.tokens.create_token(token_id, name=f"cli-{role}", role=role, secret_sha256=digest)
    await admitted(store, "guarded")

    run = await fencepost("executions", "get", "guarded", url=secured.base)
    assert run.rc == 1 and run.err.startswith("error: UNAUTHENTICATED: "), run
    run = await fencepost("executions", "get", "guarded", "--json", url=secured.base,
                          env={"FENCEPOST_TOKEN": tokens["read"]})
    assert run.rc == 0 and run.json()["executionId"] == "guarded", run
    # A read token may not cancel: 403, exit 1; the flag overrides the variable.
    run = await fencepost("executions", "cancel", "guarded", url=secured.base,
                          env={"FENCEPOST_TOKEN": tokens["read"]})
    assert run.rc == 1 and run.err.startswith("error: FORBIDDEN: "), run
    run = await fencepost("executions", "cancel", "guarded", "--token", tokens["operate"],
                          url=secured.base, env={"FENCEPOST_TOKEN": tokens["read"]})
    assert run.rc == 0, run
    # --url overrides FENCEPOST_URL (here: a service that is not there).
    nobody = f"http://127.0.0.1:{free_port()}"
    run = await fencepost("executions", "get", "guarded", "--json", "--url", secured.base,
                          "--token", tokens["read"], url=nobody)
    assert run.rc == 0 and json.loads(run.out)["status"] == "cancelled", run


async def test_a_reader_that_stops_early_gets_no_error_message(server, workers):
    """`fencepost ... | head`: stdout closed before the answer is written."""
    await workers.start()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    environ["FENCEPOST_URL"] = server.base
    command = f"{shlex.quote(sys.executable)} -m app.cli workers --json | true"
    proc = await asyncio.create_subprocess_shell(
        command, cwd=REPO_ROOT, env=environ, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    # Not "cannot connect to the database", nor a traceback: nothing.
    assert err.decode() == "", err.decode()
