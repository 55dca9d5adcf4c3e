"""`fencepost dev`: the whole service on one machine, in one command.

With DATABASE_URL unset it starts an embedded Postgres kept in
`.fencepost/pgdata`, migrates, then runs the API and two workers (the example
workflows unless FENCEPOST_WORKFLOWS names others) as child processes with
their logs interleaved. A child that dies (a worker SIGKILLed to try the
failure table, say) is started again under the same name, logged, while the
others keep running. Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

from app.settings import Settings

DATA_DIR = Path(".fencepost") / "pgdata"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=8, help="deliveries per worker (default 8)")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR,
                   help="embedded Postgres data folder (default .fencepost/pgdata)")


def spawn_children(url: str, *, host: str, port: int, workers: int, concurrency: int,
                   env_extra: dict[str, str] | None = None, log_level: str = "info",
                   log_format: str = "json", stderr: int | IO[Any] | None = None,
                   api: bool = True, first_worker: int = 1) -> list[subprocess.Popen[bytes]]:
    # Local loopback processes for dev, bench and soak: no tokens unless the
    # caller asks for them (FENCEPOST_AUTH in env_extra).
    env = child_env(url, env_extra)
    exe = [sys.executable, "-m", "app.cli"]
    common: dict[str, Any] = {"env": env, "start_new_session": True, "stderr": stderr}
    # Own sessions: a Ctrl-C at the terminal reaches only this process, which
    # then stops the children in order (one SIGTERM each: a graceful stop).
    children = []
    if api:
        children.append(subprocess.Popen(
            [*exe, "api", "--host", host, "--port", str(port), "--log-level", log_level,
             "--log-format", log_format], **common
        ))
    for n in range(first_worker - 1, first_worker - 1 + workers):
        children.append(subprocess.Popen(
            [*exe, "worker", "--concurrency", str(concurrency), "--worker-id",
             f"{socket.gethostname()}-worker-{n + 1}-{os.getpid()}", "--log-level", log_level,
             "--log-format", log_format],
            **common,
        ))
    return children


def child_env(url: str, env_extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url, "FENCEPOST_AUTH": "disabled", **(env_extra or {})}


def describe(child: subprocess.Popen[bytes]) -> str:
    """`worker <worker ID>` or `api`, for log lines about a child."""
    raw = child.args
    args = ([os.fsdecode(raw)] if isinstance(raw, str | bytes | os.PathLike)
            else [os.fsdecode(a) for a in raw])
    if "--worker-id" in args:
        return f"worker {args[args.index('--worker-id') + 1]}"
    return "api" if "api" in args else " ".join(args[3:5])


# A child exiting with this code refused its configuration (no workflows, a bad
# flag): starting it again cannot help, so dev stops.
USAGE_ERROR = 2
RESTART_BACKOFF = (0.5, 30.0)  # first delay, cap; doubles while a child keeps dying young
STABLE_AFTER = 30.0  # a child that ran this long gets the first delay again


class Supervisor:
    """Restarts a dead child with the same command line and environment, with a
    doubling delay while it keeps dying young; the other children are untouched."""

    def __init__(self, children: list[subprocess.Popen[bytes]], env: dict[str, str]):
        self.children = children
        self.env = env
        now = time.monotonic()
        self.started = {id(c): now for c in children}
        self.delay = {id(c): RESTART_BACKOFF[0] for c in children}
        self.due: dict[int, float] = {}  # position -> monotonic time to restart

    def check(self) -> int | None:
        """Restart what is due; returns an exit code when dev must stop."""
        now = time.monotonic()
        for i, child in enumerate(self.children):
            if child.poll() is None:
                continue
            if child.returncode == USAGE_ERROR:
                print(f"fencepost dev: {describe(child)} refused to start (exit {USAGE_ERROR}); stopping",
                      file=sys.stderr, flush=True)
                return 1
            if i not in self.due:
                ran = now - self.started[id(child)]
                delay = RESTART_BACKOFF[0] if ran >= STABLE_AFTER else self.delay[id(child)]
                self.due[i] = now + delay
                print(f"fencepost dev: {describe(child)} (pid {child.pid}) exited with "
                      f"{child.returncode}; restarting it in {delay:.1f}s, the rest keeps running",
                      file=sys.stderr, flush=True)
                self.delay[id(child)] = min(delay * 2, RESTART_BACKOFF[1])
            elif now >= self.due[i]:
                del self.due[i]
                new = subprocess.Popen(child.args, env=self.env, start_new_session=True)
                self.started[id(new)] = now
                self.delay[id(new)] = self.delay.pop(id(child))
                self.children[i] = new
                print(f"fencepost dev: {describe(new)} restarted (pid {new.pid})",
                      file=sys.stderr, flush=True)
        return None


def suggestion(modules: list[str]) -> tuple[str, dict[str, Any]]:
    """A workflow the dev workers actually carry, with params to try it."""
    from app.registry import load_workflows

    try:
        loaded = load_workflows(modules)
    except Exception as exc:  # the workers will say what is wrong, loudly
        print(f"fencepost dev: could not import {modules}: {exc!r}", file=sys.stderr, flush=True)
        loaded = {}
    if "charge-order" in loaded:
        return "charge-order", {"order_id": 42}
    if loaded:
        return sorted(loaded)[0], {}
    return "your-workflow", {}


def stop_children(children: list[subprocess.Popen[bytes]], grace: float = 15.0) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def dev_overrides() -> dict[str, str]:
    """What `fencepost dev` changes for its API: plain-HTTP cookies (the
    dashboard on http://host:port) and the /docs pages, unless the environment
    sets them."""
    defaults = {"FENCEPOST_COOKIE_SECURE": "false", "FENCEPOST_API_DOCS": "true"}
    return {name: os.environ.get(name, value) for name, value in defaults.items()}


def run(args: argparse.Namespace, settings: Settings) -> int:
    from app.migrate import upgrade

    server = None
    url = settings.database_url
    if not url:
        from app.embedded import start_embedded_postgres

        print(f"fencepost dev: starting embedded Postgres in {args.data_dir}/", flush=True)
        server = start_embedded_postgres(args.data_dir)
        url = server.url
    asyncio.run(upgrade(url))
    workflows = settings.workflows or "app.examples"
    env = {"FENCEPOST_WORKFLOWS": workflows, **dev_overrides()}
    base = f"http://{args.host}:{args.port}"
    workflow_id, params = suggestion([m.strip() for m in workflows.split(",") if m.strip()])
    example_id = "order-42" if workflow_id == "charge-order" else f"{workflow_id}-1"
    body = json.dumps({"workflowId": workflow_id, "executionId": example_id, "params": params})
    database = (f"embedded, data in {args.data_dir}\n             DATABASE_URL={url}\n"
                "             (psql it, or create the tables your transactional steps write)"
                if server else "DATABASE_URL from the environment")
    print(
        f"""
fencepost dev
  API        {base}   (OpenAPI docs at {base}/docs)
  workers    {args.workers} x concurrency {args.concurrency}
  workflows  {workflows}
  database   {database}
  auth       FENCEPOST_AUTH=disabled: a development setup; do not expose it
  cookies    FENCEPOST_COOKIE_SECURE={env["FENCEPOST_COOKIE_SECURE"]}: {
    "sent over plain HTTP (development only)" if env["FENCEPOST_COOKIE_SECURE"] == "false"
    else "HTTPS only"}

Try:
  curl -s -X POST {base}/v1/executions -H 'content-type: application/json' \\
       -d '{body}'
  curl -s {base}/v1/executions/{example_id}
A worker or the API that dies is started again; kill one to try the failure table.
Ctrl-C stops everything.
""",
        flush=True,
    )
    children = spawn_children(url, host=args.host, port=args.port, workers=args.workers,
                              concurrency=args.concurrency, env_extra=env, log_format="console")
    supervisor = Supervisor(children, child_env(url, env))
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            for child in children:
                if child.poll() is None:
                    child.kill()
            return
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        while True:
            stop = supervisor.check()
            if stop is not None:
                code = stop
                raise KeyboardInterrupt
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nfencepost dev: stopping", flush=True)
    finally:
        stop_children(children)
        if server is not None:
            server.stop()
    return code
