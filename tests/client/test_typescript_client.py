"""Issue 14 item 4: a TypeScript client generated from the live service's
/openapi.json with a real generator from the npm registry (@hey-api/openapi-ts,
pinned in tests/client/typescript/package.json), type-checked strictly with
tsc, then run with Node against the running service: it admits an execution,
waits for it by long-poll and reads its events. The generated functions are
named after the API's operation IDs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "typescript"

pytestmark = pytest.mark.timeout(300)


def _npm(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["npm", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _npx(*args: str, cwd: Path, env: dict | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["npx", "--no-install", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The generator, tsc and tsx installed from the npm registry (`make test`
    installs Node itself when missing)."""
    assert shutil.which("npm"), "Node.js and npm are needed: `make test` installs them"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout
    major, minor = (int(x) for x in version.strip().lstrip("v").split(".")[:2])
    assert (major, minor) >= (20, 19), f"the generator needs Node.js >= 20.19, found {version}"
    root = tmp_path_factory.mktemp("ts-client")
    for name in ("package.json", "tsconfig.json", "use-client.ts"):
        shutil.copy(HERE / name, root / name)
    done = _npm("install", "--no-audit", "--no-fund", cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    return root


async def test_a_generated_typescript_client_admits_waits_and_reads_events(
        project: Path, server, workers) -> None:
    await workers.start()
    generated = await asyncio.to_thread(
        _npx, "openapi-ts", "-i", f"{server.base}/openapi.json", "-o", "gen", cwd=project)
    assert generated.returncode == 0, generated.stdout[-2000:] + generated.stderr[-2000:]
    sdk = (project / "gen" / "sdk.gen.ts").read_text()
    names = re.findall(r"^export const (\w+)", sdk, flags=re.MULTILINE)
    print("generated SDK functions:", ", ".join(names))
    assert {"admitExecution", "getExecution", "listExecutionEvents", "signalExecution",
            "cancelExecution", "redriveExecution", "createSchedule"} <= set(names), names

    checked = await asyncio.to_thread(_npx, "tsc", "-p", "tsconfig.json", cwd=project)
    assert checked.returncode == 0, checked.stdout[-3000:]

    ran = await asyncio.to_thread(_npx, "tsx", "use-client.ts", cwd=project,
                                  env={"FENCEPOST_URL": server.base, "EXECUTION_ID": "ts-1"})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    print("the Node script printed:", answer)
    assert answer["admitted"] == "admitted" and answer["status"] == "completed", answer
    assert answer["outcome"] == {"result": {"from": "typescript"}}, answer
    assert answer["events"][0] == "admitted" and "acknowledged" in answer["events"], answer
