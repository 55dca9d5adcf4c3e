"""The failure table, with containers (issue 17, item 2): a worker container killed
and another stopped mid-load, and the Postgres container restarted under load.

Load comes from `container-steps` (tests/containers/workflows): steps of a fixed
length, so deliveries are running when a container is killed or stopped.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest

from tests.containers.stack import (
    FIGURES,
    Stack,
    admit,
    check_exactly_once,
    docker_inspect,
    events,
    run,
    wait_completed,
    wait_for,
)

pytestmark = [pytest.mark.containers, pytest.mark.timeout(600)]

STEPS = 4
STEP_SECONDS = 0.5
SHUTDOWN_GRACE_SECONDS = 30  # FENCEPOST_SHUTDOWN_GRACE_SECONDS's default: compose sets none


def _expected(execution_id: str, n: int) -> tuple[list[str], dict]:
    return [f"step-{k}" for k in range(STEPS)], {"n": n + STEPS}


def _leases_by_host(client: httpx.Client) -> dict[str, dict[str, int]]:
    """host (a container's hostname) -> {executionId: token} of the running deliveries."""
    page = client.get("/v1/executions", params={"status": "running", "limit": 500})
    held: dict[str, dict[str, int]] = {}
    for execution in page.raise_for_status().json()["executions"]:
        lease = execution["lease"]
        if lease:
            held.setdefault(lease["owner"].split(":")[0], {})[execution["executionId"]] = (
                lease["token"])
    return held


def test_a_killed_and_a_stopped_worker_lose_nothing_and_record_each_step_once(stack: Stack):
    killed, stopped = stack.ensure_workers(2)
    host = {c: docker_inspect(c)["Config"]["Hostname"] for c in (killed, stopped)}
    assert docker_inspect(stopped)["Config"]["StopTimeout"] == 45, "stop_grace_period: 45s"
    trigger = stack.client(stack.create_token("trigger", "kill-load"))
    expected = {}
    for n in range(60):
        execution_id = f"kill-{n}"
        admit(trigger, "container-steps", execution_id,
              {"n": n, "steps": STEPS, "step_seconds": STEP_SECONDS})
        expected[execution_id] = _expected(execution_id, n)

    both = wait_for("both workers running deliveries", lambda: (
        held if all((held := _leases_by_host(trigger)).get(host[c]) for c in (killed, stopped))
        else None), timeout=60)
    killed_at = time.monotonic()
    run(["docker", "kill", killed], timeout=60)
    lost = both[host[killed]]

    draining = _leases_by_host(trigger).get(host[stopped], {})
    assert draining, "the worker to stop holds no delivery"
    started = time.monotonic()
    run(["docker", "stop", stopped], timeout=120)
    stop_seconds = time.monotonic() - started
    state = docker_inspect(stopped)["State"]
    assert state["ExitCode"] == 0 and stop_seconds < SHUTDOWN_GRACE_SECONDS, (state, stop_seconds)
    assert docker_inspect(killed)["State"]["ExitCode"] == 137

    run(["docker", "start", stopped], timeout=60)
    wait_completed(trigger, list(expected), timeout=240)
    after_kill = time.monotonic() - killed_at
    kinds = check_exactly_once(trigger, expected)

    # The stopped worker ended each delivery it was running: acknowledged or released
    # under its lease, none left to expire.
    for execution_id, token in draining.items():
        ended = {e["kind"] for e in events(trigger, execution_id) if e["token"] == token}
        assert ended & {"acknowledged", "released"} and "lease_expired" not in ended, (
            execution_id, ended)
    # The killed worker's were taken over once their leases expired.
    for execution_id, token in lost.items():
        ended = {e["kind"] for e in events(trigger, execution_id) if e["token"] == token}
        assert "lease_expired" in ended or "acknowledged" in ended, (execution_id, ended)
    assert kinds["lease_expired"] >= 1, kinds
    FIGURES["docker kill + docker stop"] = (
        f"{len(expected)}/{len(expected)} completed {after_kill:.1f} s after the kill "
        f"(each step recorded once); killed worker held {len(lost)} deliveries, "
        f"{kinds['lease_expired']} leases expired; stopped worker exited "
        f"{state['ExitCode']} in {stop_seconds:.1f} s draining {len(draining)} deliveries "
        f"({kinds['released']} released in all)")


class _Load:
    """Clients that admit and read executions until stopped, counting every answer."""

    def __init__(self, client: httpx.Client, prefix: str, threads: int = 4) -> None:
        self.client = client
        self.prefix = prefix
        self.answers: Counter = Counter()
        self.transport_errors: list[str] = []
        self.admitted: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _ask(self, method: str, url: str, **kwargs) -> int | None:
        try:
            status = self.client.request(method, url, **kwargs).status_code
        except httpx.HTTPError as exc:
            with self.lock:
                self.transport_errors.append(f"{type(exc).__name__}: {exc}")
            return None
        with self.lock:
            self.answers[status] += 1
        return status

    def _run(self, thread: int) -> None:
        n = 0
        while not self.stop.is_set():
            execution_id = f"{self.prefix}-{thread}-{n}"
            body = {"workflowId": "container-steps", "executionId": execution_id,
                    "params": {"n": n, "steps": STEPS, "step_seconds": 0.1}}
            # The same ID again until it is stored (201) or known (409).
            while self._ask("POST", "/v1/executions", json=body) not in (201, 409):
                if self.stop.is_set():
                    return
            with self.lock:
                self.admitted.append(execution_id)
            self._ask("GET", f"/v1/executions/{execution_id}")
            n += 1

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def test_postgres_restarted_under_load_gives_503_never_500_and_everything_completes(
        stack: Stack):
    stack.ensure_workers(2)
    trigger = stack.client(stack.create_token("trigger", "restart-load"))
    (postgres,) = stack.containers("postgres")
    with _Load(trigger, "pg") as load:
        wait_for("admissions under way", lambda: len(load.admitted) >= 20, timeout=60)
        before = len(load.admitted)
        started = time.monotonic()
        run(["docker", "restart", postgres], timeout=120)
        restart_seconds = time.monotonic() - started
        stack.wait_healthy(postgres)
        wait_for("the API ready again", lambda: httpx.get(
            f"{stack.api_url()}/readyz", timeout=5).status_code == 200, timeout=60)
        wait_for("admissions going on after the restart",
                 lambda: len(load.admitted) >= before + 40, timeout=120)
    answers, admitted = dict(load.answers), list(load.admitted)

    assert not load.transport_errors, load.transport_errors[:5]
    assert set(answers) <= {200, 201, 409, 503}, answers
    assert answers.get(503, 0) >= 1, f"no request saw the restart: {answers}"
    completed_in = wait_completed(trigger, admitted, timeout=240)
    expected = {execution_id: ([f"step-{k}" for k in range(STEPS)],
                               {"n": int(execution_id.rsplit("-", 1)[1]) + STEPS})
                for execution_id in admitted}
    check_exactly_once(trigger, expected)
    FIGURES["postgres restart"] = (
        f"`docker restart` took {restart_seconds:.1f} s; {sum(answers.values())} answers: "
        f"{answers.get(503, 0)} x 503, {answers.get(500, 0)} x 500, {answers}; "
        f"{len(admitted)} admitted, all completed {completed_in:.1f} s after the load stopped")
