"""Issue 20, item 4: a configuration failure is one line on stderr and exit
code 2, naming the setting and what to do, never a traceback. Each row runs
the real CLI against a real, migrated database, so the only thing wrong is
the one setting the row breaks. Also: a warning line when the API starts
with authentication disabled, and `fencepost --version`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys

import asyncpg
import pytest

from app.db import asyncpg_dsn
from app.version import VERSION
from tests.support.api_process import api_env, free_port
from tests.support.processes import REPO_ROOT
from tests.support.waiting import wait_until

WORKFLOWS = "tests.maintenance.flows"


@contextlib.contextmanager
def port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield str(s.getsockname()[1])


async def newer_schema(url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = 'f00dfeedbeef'")
    finally:
        await conn.close()


# id, command line ({port} is a port another socket holds), environment
# ({url} is the test database), optional set-up, words the line must contain.
CASES = [
    ("database-url-scheme", ["api"], {"DATABASE_URL": "mysql://u@localhost/db"}, None,
     ["DATABASE_URL", "postgresql://"]),
    ("database-url-port", ["worker", "--workflows", WORKFLOWS],
     {"DATABASE_URL": "postgresql://u@localhost:notaport/db"}, None, ["DATABASE_URL", "port"]),
    ("missing-workflow-module", ["worker", "--workflows", "no_such_flows_module"], {}, None,
     ["FENCEPOST_WORKFLOWS", "no_such_flows_module"]),
    ("missing-workflow-module-api", ["api", "--workflows", "no_such_flows_module"], {}, None,
     ["FENCEPOST_WORKFLOWS", "no_such_flows_module"]),
    ("api-port-out-of-range", ["api", "--port", "99999"], {}, None, ["--port", "65535"]),
    ("api-port-in-use", ["api", "--port", "{port}"], {}, None, ["--port", "in use"]),
    ("metrics-port-in-use", ["worker", "--workflows", WORKFLOWS, "--metrics-port", "{port}"],
     {}, None, ["--metrics-port", "in use"]),
    ("metrics-port-out-of-range", ["worker", "--workflows", WORKFLOWS, "--metrics-port",
                                   "70000"], {}, None, ["--metrics-port", "65535"]),
    ("concurrency-zero", ["worker", "--workflows", WORKFLOWS, "--concurrency", "0"], {}, None,
     ["--concurrency"]),
    ("schema-newer-api", ["api"], {}, newer_schema, ["newer than this build", "f00dfeedbeef"]),
    ("schema-newer-worker", ["worker", "--workflows", WORKFLOWS], {}, newer_schema,
     ["newer than this build"]),
    ("schema-newer-migrate", ["migrate"], {}, newer_schema, ["newer than this build"]),
    ("renew-not-shorter-than-lease", ["worker", "--workflows", WORKFLOWS],
     {"FENCEPOST_LEASE_SECONDS": "5", "FENCEPOST_RENEW_SECONDS": "6"}, None,
     ["FENCEPOST_RENEW_SECONDS", "FENCEPOST_LEASE_SECONDS"]),
    ("pool-min-above-max", ["api"],
     {"FENCEPOST_POOL_MIN_SIZE": "5", "FENCEPOST_POOL_MAX_SIZE": "2"}, None,
     ["FENCEPOST_POOL_MIN_SIZE"]),
    ("auth-not-a-choice", ["api"], {"FENCEPOST_AUTH": "maybe"}, None, ["FENCEPOST_AUTH"]),
    ("lease-not-a-number", ["api"], {"FENCEPOST_LEASE_SECONDS": "soon"}, None,
     ["FENCEPOST_LEASE_SECONDS"]),
]


@pytest.mark.parametrize("argv, env, setup, words", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_a_configuration_failure_is_one_line_and_exit_2(database_url, argv, env, setup,
                                                              words):
    if setup is not None:
        await setup(database_url)
    environ = api_env(database_url, {"FENCEPOST_AUTH": "disabled", **env})
    with port_in_use() as held:
        argv = [a.replace("{port}", held) for a in argv]
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "app.cli", *argv], cwd=REPO_ROOT,
            env=environ, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_version_prints_the_build_version():
    proc = subprocess.run([sys.executable, "-m", "app.cli", "--version"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"fencepost {VERSION}"
    assert VERSION and VERSION[0].isdigit()


async def test_the_api_warns_once_at_start_when_authentication_is_disabled(database_url,
                                                                            tmp_path):
    log = tmp_path / "api.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(free_port()),
             "--log-format", "json"], cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
            env=api_env(database_url, {"FENCEPOST_AUTH": "disabled"}))
        try:
            def warned() -> bool:
                assert proc.poll() is None, log.read_text()
                return "authentication is disabled" in log.read_text()

            await wait_until(warned, timeout=30, interval=0.05, detail=log.read_text,
                             what="the warning that authentication is disabled")
        finally:
            proc.kill()
            proc.wait()
    warnings = [line for line in log.read_text().splitlines()
                if "authentication is disabled" in line]
    assert len(warnings) == 1 and '"level": "warning"' in warnings[0], warnings
    assert "FENCEPOST_AUTH" in warnings[0]

