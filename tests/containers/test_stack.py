"""The compose stack as a user runs it (issue 17, item 2), by the commands of the
README's deployment section: `up --build -d` (the `stack` fixture) with a workflow
folder of one's own (WORKFLOWS_DIR, FENCEPOST_WORKFLOWS), the first token made
in the API container, the example workflows admitted over HTTP and completed, workers
scaled to three, `down -v --remove-orphans` (the `project` fixture; test_teardown.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.containers.stack import (
    Stack,
    admit,
    docker_inspect,
    wait_completed,
    wait_for,
)

pytestmark = pytest.mark.containers


def test_a_trigger_token_admits_the_example_workflows_and_they_complete(stack: Stack):
    trigger = stack.client(stack.create_token("trigger", "shop"))
    operate = stack.client(stack.create_token("operate", "ops"))
    # Authentication is on: without a token nothing is admitted.
    anonymous = httpx.post(f"{stack.api_url()}/v1/executions", timeout=10, json={
        "workflowId": "charge-order", "executionId": "no-token", "params": {"order_id": 1}})
    assert anonymous.status_code == 401, anonymous.text

    # The README's curl, then a few more with a shorter cancel window.
    admit(trigger, "charge-order", "order-42", {"order_id": 42})
    orders = ["order-42"] + [f"order-{i}" for i in range(5)]
    for i, execution_id in enumerate(orders[1:], start=1):
        admit(trigger, "charge-order", execution_id,
              {"order_id": i, "cancel_window_seconds": 0.2})
    # team_flows, from the mounted workflow folder.
    welcomes = [f"welcome-{i}" for i in range(3)]
    for i, execution_id in enumerate(welcomes, start=1):
        admit(trigger, "welcome-customer", execution_id,
              {"customer_id": i, "email": f"c{i}@example.com", "follow_up_after_seconds": 0.2})
    admit(trigger, "approve-refund", "refund-7", {"order_id": 7, "amount_cents": 500})
    wait_for("refund-7 waiting for its approval", lambda: (trigger.get(
        "/v1/executions/refund-7").json()["blockedBy"] or {}).get("reason")
        == "waiting-for-signal", timeout=60)
    # Only an operator may approve; the trigger token that admitted it may not.
    refused = trigger.post("/v1/executions/refund-7/signals/approval", json={"approved": True})
    assert refused.status_code == 403, refused.text
    operate.post("/v1/executions/refund-7/signals/approval",
                 json={"approved": True}).raise_for_status()

    wait_completed(trigger, [*orders, *welcomes, "refund-7"], timeout=90)
    for execution_id in orders:
        result = trigger.get(f"/v1/executions/{execution_id}").json()["outcome"]["result"]
        assert result["charged"] is True and result["receipt"]["chargeId"].startswith("ch_")
    for execution_id in welcomes:
        result = trigger.get(f"/v1/executions/{execution_id}").json()["outcome"]["result"]
        assert len(result["messages"]) == 2, result
    refund = trigger.get("/v1/executions/refund-7").json()["outcome"]["result"]
    assert refund["refunded"] is True and refund["approvedBy"]["role"] == "operate", refund


def test_scaled_to_three_workers_all_three_register(stack: Stack):
    stack.compose("up", "-d", "--scale", "worker=3", timeout=300)
    workers = stack.running("worker")
    assert len(workers) == 3, workers
    hosts = {docker_inspect(c)["Config"]["Hostname"] for c in workers}
    reader = stack.client(stack.create_token("read", "scale-check"))

    def all_registered() -> bool:
        listed = reader.get("/v1/workers").raise_for_status().json()["workers"]
        return hosts <= {w["host"] for w in listed if w["alive"]}

    wait_for("three workers alive in /v1/workers", all_registered, timeout=90)
    for container in workers:
        stack.wait_healthy(container)


def test_the_roles_one_shot_leaves_roles_that_exist_as_they_are(stack: Stack):
    """Run again (a restart, or a volume set up earlier), it changes nothing and succeeds."""
    again = stack.compose("run", "--rm", "-T", "--no-deps", "roles", timeout=120)
    assert "fencepost_migrator and fencepost_runtime exist" in again.stdout, again.stdout
