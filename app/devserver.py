"""`fencepost dev`: the whole service on one machine, in one command.

With DATABASE_URL unset it starts an embedded Postgres kept in
`.fencepost/pgdata`, migrates, then runs the API and two workers (the example
workflows unless FENCEPOST_WORKFLOWS names others) as child processes with
their logs interleaved. Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
                   log_format: str = "json", stderr=None, api: bool = True,
                   first_worker: int = 1) -> list[subprocess.Popen]:
    # Local loopback processes for dev, bench and soak: no tokens unless the
    # caller asks for them (FENCEPOST_AUTH in env_extra).
    env = {**os.environ, "DATABASE_URL": url, "FENCEPOST_AUTH": "disabled", **(env_extra or {})}
    exe = [sys.executable, "-m", "app.cli"]
    common = {"env": env, "start_new_session": True, "stderr": stderr}
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


def stop_children(children: list[subprocess.Popen], grace: float = 15.0) -> None:
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
    print(
        f"""
fencepost dev
  API        {base}   (OpenAPI docs at {base}/docs)
  workers    {args.workers} x concurrency {args.concurrency}
  workflows  {workflows}
  database   {'embedded, data in ' + str(args.data_dir) if server else 'DATABASE_URL'}
  auth       FENCEPOST_AUTH=disabled: a development setup; do not expose it
  cookies    FENCEPOST_COOKIE_SECURE={env["FENCEPOST_COOKIE_SECURE"]}: {
    "sent over plain HTTP (development only)" if env["FENCEPOST_COOKIE_SECURE"] == "false"
    else "HTTPS only"}

Try:
  curl -s -X POST {base}/v1/executions -H 'content-type: application/json' \\
       -d '{{"workflowId": "charge-order", "executionId": "order-42", "params": {{"order_id": 42}}}}'
  curl -s {base}/v1/executions/order-42
Ctrl-C stops everything.
""",
        flush=True,
    )
    children = spawn_children(url, host=args.host, port=args.port, workers=args.workers,
                              concurrency=args.concurrency, env_extra=env, log_format="console")
    stopping = False

    def on_signal(signum, _frame) -> None:
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
            for child in children:
                if child.poll() is not None:
                    print(f"fencepost dev: {' '.join(child.args[3:5])} exited with {child.returncode};"
                          " stopping", file=sys.stderr, flush=True)
                    code = 1
                    raise KeyboardInterrupt
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nfencepost dev: stopping", flush=True)
    finally:
        stop_children(children)
        if server is not None:
            server.stop()
    return code
