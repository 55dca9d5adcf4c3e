"""Fixtures for the operator CLI tests (issue 13 item 4): the real app served
by a real uvicorn (own thread and loop) on the per-test database, real
in-process workers running tests/cli/flows.py, and the CLI itself run as a
subprocess (`python -m app.cli ...`), as an operator runs it.

  server      a live server with the flows registered (srv.base, srv.app)
  make_server `await make_server(settings=None)`: another one (e.g. auth enabled)
  workers     InProcessWorkers for the flows (`await workers.start()`)
  store       ExecutionStore on the test pool
  fencepost   `run = await fencepost(*args, url=server.base, env=None)`: run.rc,
              run.out, run.err, run.json() (stdout parsed)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.settings import Settings
from tests.cli import flows as cli_flows
from tests.support.live_server import ServerThread, server_factory
from tests.support.processes import REPO_ROOT
from tests.support.timing import QUICK
from tests.support.workers import InProcessWorkers


@pytest.fixture
def cli_settings(settings: Settings) -> Settings:
    return settings.model_copy(update=QUICK)


@pytest.fixture
def flows():
    return load_workflows(["tests.cli.flows"])


@pytest.fixture
def store_settings(cli_settings: Settings) -> Settings:
    return cli_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest_asyncio.fixture
async def make_server(cli_settings, flows) -> AsyncIterator:
    async with server_factory(cli_settings, flows, name="cli-test-server") as make:
        yield make


@pytest_asyncio.fixture
async def server(make_server) -> ServerThread:
    return await make_server()


@pytest_asyncio.fixture
async def workers(cli_settings, flows) -> AsyncIterator[InProcessWorkers]:
    cli_flows.BROKEN["charge"] = True
    w = InProcessWorkers(cli_settings, flows)
    yield w
    await w.stop_all()
    cli_flows.BROKEN["charge"] = True


@dataclass
class Run:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"fencepost {' '.join(self.args)} -> {self.rc}\n{self.out}\n{self.err}"


@pytest.fixture
def fencepost(server):
    """The CLI as a subprocess; asynchronous, so the in-process workers keep
    running while it waits. Only FENCEPOST_URL (and what `env` adds) is set."""

    async def run(*args: str, url: str | None = server.base,
                  env: dict[str, str] | None = None) -> Run:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
        if url is not None:
            environ["FENCEPOST_URL"] = url
        environ.update(env or {})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", *args, cwd=REPO_ROOT, env=environ,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
        return Run(args, proc.returncode, out.decode(), err.decode())

    return run
