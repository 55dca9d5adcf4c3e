"""A real `fencepost api` process for tests (tenancy, concurrent callers, shared settings):
started with only the FENCEPOST_* settings given, on 127.0.0.1:<free port>
unless told otherwise, log in `<log_dir>/api-<n>.log`, killed in stop()."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.processes import REPO_ROOT, _die_with_parent
from tests.support.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_env(database_url: str, env: dict[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
    environ.update({"DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    environ.update(env or {})
    return environ


def run_api_cli(database_url: str, *args: str, env: dict[str, str] | None = None,
                timeout: float = 30) -> subprocess.CompletedProcess:
    """`fencepost api ARGS` expected to exit by itself (a refusal): its output."""
    return subprocess.run([sys.executable, "-m", "app.cli", "api", *args], cwd=REPO_ROOT,
                          env=api_env(database_url, env), capture_output=True, text=True,
                          timeout=timeout)


class ApiProcess:
    def __init__(self, database_url: str, log_dir: Path, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"api-{self.port}.log"
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(self.port),
             "--log-format", "console", "--log-level", "warning", *args],
            cwd=REPO_ROOT, env=api_env(database_url, env), stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait_ready(self, timeout: float = 30, host: str = "localhost") -> ApiProcess:
        async with httpx.AsyncClient(base_url=self.base, timeout=2) as c:
            async def ready() -> bool:
                assert self.proc.poll() is None, f"api exited:\n{self.log()}"
                return (await c.get("/readyz", headers={"host": host})).status_code == 200

            await wait_until(ready, timeout=timeout, interval=0.05, what="api ready",
                             tolerate=(httpx.TransportError,), detail=self.log)
        return self

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


async def raw_request(port: int, head: bytes, timeout: float = 30) -> tuple[int, dict, bytes]:
    """Send `head` (request line and headers, ending in a blank line) on a new
    connection, then read the whole answer (the request says Connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    top, _, body = raw.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/1.1 "), raw[:200]
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(lines[0].split(" ")[1]), hdrs, body
