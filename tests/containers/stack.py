"""The compose stack of docker-compose.yml, driven the way the README tells a user to,
under a project name and passwords of its own.

Everything here waits on a condition (a container's health, an HTTP answer, an
execution's status) with a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from tests.support.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
FLOWS = Path(__file__).resolve().parent / "workflows"
# What compose interpolates (docker-compose.yml's header lists them); nothing else
# from the caller's environment may leak in.
COMPOSE_VARIABLES = ("POSTGRES_PASSWORD", "MIGRATOR_PASSWORD",
                     "RUNTIME_PASSWORD", "FENCEPOST_WORKFLOWS",
                     "WORKFLOWS_DIR", "API_PORT", "IMAGE_TAG",
                     "PYTHON_IMAGE", "BUILD_NETWORK", "POSTGRES_IMAGE")
WORKFLOWS = "app.examples,team_flows,container_flows"

T = TypeVar("T")

# Figures the suite measured, printed at the end of the run (conftest.py).
FIGURES: dict[str, str] = {}


def dockerfile_default(arg: str) -> str:
    match = re.search(rf"^ARG {arg}=(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match, f"the Dockerfile declares no default for {arg}"
    return match[1]


def compose_default(variable: str) -> str:
    match = re.search(rf"\$\{{{variable}:-([^}}]+)\}}", (ROOT / "docker-compose.yml").read_text())
    assert match, f"docker-compose.yml gives {variable} no default"
    return match[1]


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` exited {done.returncode}:\n"
                             f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def find_compose_command() -> list[str] | None:
    """`docker compose` (v2) when the plugin answers, else `docker-compose` (v1)."""
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def wait_for(what: str, probe: Callable[[], T], timeout: float, every: float = 0.25) -> T:
    """probe() until it returns something true; its last error in the failure."""
    return wait_until_sync(probe, what=what, timeout=timeout, interval=every,
                           tolerate=(httpx.HTTPError, OSError, AssertionError))


def docker_inspect(container: str) -> dict:
    return json.loads(run(["docker", "inspect", container], timeout=30).stdout)[0]


@dataclass
class Stack:
    command: list[str]
    project: str
    env: dict[str, str]
    _clients: list[httpx.Client] = field(default_factory=list)

    @classmethod
    def new(cls, command: list[str], workflows_dir: Path) -> Stack:
        project = f"fpct{secrets.token_hex(5)}"
        env = {k: v for k, v in os.environ.items()
               if k not in COMPOSE_VARIABLES and not k.startswith("FENCEPOST_")
               and k != "DATABASE_URL"}
        env.update({
            "POSTGRES_PASSWORD": secrets.token_hex(24),
            "MIGRATOR_PASSWORD": secrets.token_hex(24),
            "RUNTIME_PASSWORD": secrets.token_hex(24),
            # The API on a free loopback port (8000 may be taken, or another session's).
            "API_PORT": "0",
            # Its own tag: a user's fencepost:<version> stays as it was.
            "IMAGE_TAG": f"fencepost-test:{project}",
            "FENCEPOST_WORKFLOWS": WORKFLOWS,
            "WORKFLOWS_DIR": str(workflows_dir),
            # Builds reach the package index only through the host's network here.
            "BUILD_NETWORK": os.environ.get("BUILD_NETWORK", "host"),
        })
        for name in ("PYTHON_IMAGE", "POSTGRES_IMAGE"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        return cls(command, project, env)

    # ------------------------------------------------------------ compose and docker

    def compose(self, *args: str, timeout: float = 300, check: bool = True
                ) -> subprocess.CompletedProcess:
        return run([*self.command, "-p", self.project, *args], env=self.env, timeout=timeout,
                   check=check)

    def containers(self, service: str) -> list[str]:
        """IDs of the service's containers, running or not, by replica number."""
        out = run(["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                   "--filter", f"label=com.docker.compose.service={service}",
                   "--format", '{{.ID}} {{.Label "com.docker.compose.container-number"}}'],
                  timeout=30).stdout.split()
        pairs = sorted(zip(out[1::2], out[0::2], strict=True), key=lambda p: int(p[0]))
        return [cid for _, cid in pairs]

    def running(self, service: str) -> list[str]:
        return [c for c in self.containers(service) if docker_inspect(c)["State"]["Running"]]

    def wait_healthy(self, container: str, timeout: float = 120) -> None:
        def healthy() -> bool:
            state = docker_inspect(container)["State"]
            assert state["Running"], f"{container} stopped: {state}"
            return state.get("Health", {}).get("Status") == "healthy"

        wait_for(f"container {container} healthy", healthy, timeout, every=0.5)

    def up(self, timeout: float = 900) -> None:
        """The README's `docker compose up --build -d`, then wait until the API and every
        worker container is healthy."""
        self.compose("up", "--build", "-d", timeout=timeout)
        for container in [*self.running("api"), *self.running("worker")]:
            self.wait_healthy(container)

    def ensure_workers(self, n: int) -> list[str]:
        """Exactly n workers running and healthy (stopped ones started again first)."""
        for container in self.containers("worker")[:n]:
            if not docker_inspect(container)["State"]["Running"]:
                run(["docker", "start", container], timeout=60)
        self.compose("up", "-d", "--no-recreate", "--no-deps", "--scale", f"worker={n}",
                     "worker")
        workers = self.running("worker")
        assert len(workers) == n, workers
        for container in workers:
            self.wait_healthy(container)
        return workers

    def down(self) -> None:
        for client in self._clients:
            client.close()
        self.compose("down", "-v", "--remove-orphans", timeout=180)

    @contextlib.contextmanager
    def torn_down(self) -> Iterator[Stack]:
        """The stack, brought down (containers, networks, volumes) however the block ends."""
        try:
            yield self
        finally:
            self.down()

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project still present."""
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            found += run(["docker", *kind, "-q", "--filter", label], timeout=30).stdout.split()
        return found

    # ------------------------------------------------------------------- the API

    def api_url(self) -> str:
        (api,) = self.containers("api")
        bindings = docker_inspect(api)["NetworkSettings"]["Ports"]["8000/tcp"]
        (binding,) = [b for b in bindings if b["HostIp"] == "127.0.0.1"]
        return f"http://127.0.0.1:{binding['HostPort']}"

    def create_token(self, role: str, name: str) -> str:
        """The README's `docker compose exec api fencepost tokens create ...` (-T: no tty)."""
        out = self.compose("exec", "-T", "api", "fencepost", "tokens", "create",
                           "--role", role, "--name", name, timeout=60).stdout
        return out.strip().splitlines()[-1].strip()

    def client(self, token: str, timeout: float = 10) -> httpx.Client:
        client = httpx.Client(base_url=self.api_url(), timeout=timeout,
                              headers={"authorization": f"Bearer {token}"})
        self._clients.append(client)
        return client


# ------------------------------------------------------------------ executions


def admit(client: httpx.Client, workflow_id: str, execution_id: str, params: dict) -> None:
    """Admit once: a 503 is asked again with the same ID (a 409 then means it was stored)."""
    def answer() -> bool:
        r = client.post("/v1/executions", json={"workflowId": workflow_id,
                                                "executionId": execution_id, "params": params})
        assert r.status_code in (201, 409, 503), f"{r.status_code} {r.text}"
        return r.status_code != 503

    wait_for(f"admission of {execution_id}", answer, timeout=60)


def statuses(client: httpx.Client, ids: list[str]) -> Counter:
    return Counter(client.get(f"/v1/executions/{i}").raise_for_status().json()["status"]
                   for i in ids)


def wait_completed(client: httpx.Client, ids: list[str], timeout: float) -> float:
    """Seconds until every execution in ids completed."""
    started = time.monotonic()
    pending = set(ids)

    def all_done() -> bool:
        for execution_id in sorted(pending):
            status = client.get(f"/v1/executions/{execution_id}").raise_for_status().json()["status"]
            assert status not in ("failed", "cancelled", "timed_out", "parked"), (
                f"{execution_id} ended {status}")
            if status != "completed":
                return False
            pending.discard(execution_id)
        return True

    wait_for(f"{len(ids)} executions completed", all_done, timeout, every=0.5)
    return time.monotonic() - started


def events(client: httpx.Client, execution_id: str) -> list[dict]:
    page = client.get(f"/v1/executions/{execution_id}/events", params={"limit": 1000})
    body = page.raise_for_status().json()
    assert body["nextAfter"] is None, f"{execution_id}: more than 1000 events"
    return body["events"]


def check_exactly_once(client: httpx.Client, executions: dict[str, tuple[list[str], dict]]
                       ) -> Counter:
    """Each execution (id -> (its step keys, its expected result)) completed with that
    result, recorded each step once and acknowledged one terminal outcome. Returns the
    event kinds counted over all of them."""
    kinds: Counter = Counter()
    for execution_id, (step_keys, result) in executions.items():
        record = client.get(f"/v1/executions/{execution_id}").raise_for_status().json()
        assert record["status"] == "completed", record
        assert record["outcome"]["result"] == result, record
        history = events(client, execution_id)
        kinds.update(e["kind"] for e in history)
        recorded = Counter(e["detail"]["stepKey"] for e in history if e["kind"] == "step_recorded")
        assert recorded == Counter(step_keys), f"{execution_id}: steps recorded {dict(recorded)}"
        terminal = [e for e in history if e["kind"] == "acknowledged"
                    and e["detail"].get("status") == "completed"]
        assert len(terminal) == 1, f"{execution_id}: {len(terminal)} completions"
    return kinds
