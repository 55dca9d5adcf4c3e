"""Shared fixtures for the tenancy tests (issue 11): the real app with
FENCEPOST_AUTH=enabled on the per-test migrated database, four tokens (two
trigger tokens for two tenants, an operate token, a read token), an
in-process client and a real uvicorn server for raw-socket attacks.

  tenancy_settings   `settings` with auth enabled and no workflow registry
  store              ExecutionStore on the test pool
  make_token         `t = await make_token("trigger", "tenant-a")` -> Token (created the way
                     `fencepost tokens create` creates one)
  tokens             Tokens(a=trigger "tenant-a", b=trigger "tenant-b", operate=operate "ops",
                     read=read "auditor"), created in the test database
  make_api           `api = await make_api(settings=None, workflows=None)`: an httpx client on a
                     fresh create_app(...) with its lifespan running (in-process ASGI)
  api                one such client on tenancy_settings
  make_server        `srv = await make_server(settings=None, workflows=None, wrap=None)`:
                     create_app(...) (wrapped by `wrap(app)`, an ASGI middleware, if given)
                     served by a real uvicorn on 127.0.0.1:<free port> (own thread and loop);
                     srv.base, srv.port, srv.client() -> httpx.AsyncClient; stopped after
  server             one such server on tenancy_settings
  admit_as           `eid = await admit_as(api, token, "eid", workflow_id="wf", params={})`:
                     POST /v1/executions as `token`, asserting 201

Helpers (import from tests.tenancy.conftest): Token, Tokens, headers(token),
BodyProbe (an ASGI wrap: `await probe.reading(path)` returns once the app asks for that
request's body, i.e. everything it does before reading the body has been done),
raw_connect(port), send_head(sock, method, path, token, length, extra=None),
read_response(sock) -> (status, headers, body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio

from app.api.app import create_app
from app.api.auth import new_token
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.support.admission import admit_api
from tests.support.asgi import asgi_client
from tests.support.live_server import ServerThread
from tests.support.timing import QUICK
from tests.support.waiting import wait_until
from tests.support.workers import InProcessWorkers


@dataclass(frozen=True)
class Token:
    token: str
    token_id: str
    name: str
    role: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass(frozen=True)
class Tokens:
    a: Token        # trigger, "tenant-a"
    b: Token        # trigger, "tenant-b"
    operate: Token  # operate, "ops"
    read: Token     # read, "auditor"


def headers(token: Token | str) -> dict[str, str]:
    value = token.token if isinstance(token, Token) else token
    return {"Authorization": f"Bearer {value}"}


@pytest.fixture
def tenancy_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth": "enabled", "workflows": ""})


@pytest.fixture
def store_settings(tenancy_settings: Settings) -> Settings:
    return tenancy_settings  # the `store` fixture (tests/conftest.py) uses these


@pytest.fixture
def make_token(store: ExecutionStore) -> Callable:
    async def _make(role: str, name: str) -> Token:
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=name, role=role, secret_sha256=digest)
        return Token(token, token_id, name, role)

    return _make


@pytest_asyncio.fixture
async def tokens(make_token: Callable) -> Tokens:
    return Tokens(
        a=await make_token("trigger", "tenant-a"),
        b=await make_token("trigger", "tenant-b"),
        operate=await make_token("operate", "ops"),
        read=await make_token("read", "auditor"),
    )


@pytest_asyncio.fixture
async def make_api(tenancy_settings: Settings) -> AsyncIterator[Callable]:
    async with contextlib.AsyncExitStack() as stack:

        async def _make(settings: Settings | None = None, workflows=None) -> httpx.AsyncClient:
            return await stack.enter_async_context(
                asgi_client(settings or tenancy_settings, workflows,
                            raise_app_exceptions=False))

        yield _make


@pytest_asyncio.fixture
async def api(make_api: Callable) -> httpx.AsyncClient:
    return await make_api()


class LiveServer(ServerThread):
    """create_app(settings, workflows) served by a real uvicorn (raw sockets work)."""

    def __init__(self, settings: Settings, workflows=None, wrap=None, **uvicorn_options) -> None:
        self.app = create_app(settings, workflows=workflows)
        served = self.app if wrap is None else wrap(self.app)
        super().__init__(served, name="tenancy-test-server", **uvicorn_options)


@pytest_asyncio.fixture
async def make_server(tenancy_settings: Settings) -> AsyncIterator[Callable]:
    servers: list[LiveServer] = []

    async def _make(settings: Settings | None = None, workflows=None, wrap=None,
                    **uvicorn_options) -> LiveServer:
        srv = LiveServer(settings or tenancy_settings, workflows, wrap, **uvicorn_options)
        servers.append(srv)
        return await srv.start()

    try:
        yield _make
    finally:
        for srv in servers:
            with contextlib.suppress(Exception):
                await srv.stop()


@pytest_asyncio.fixture
async def server(make_server: Callable) -> LiveServer:
    return await make_server()


@pytest.fixture
def admit_as() -> Callable:
    async def _admit(api: httpx.AsyncClient, token: Token | None, execution_id: str | None = None,
                     workflow_id: str = "wf", params=None, **body) -> str:
        r = await admit_api(api, workflow_id, execution_id, params,
                            headers=headers(token) if token is not None else None, **body)
        assert r.status_code == 201, r.text
        return r.json()["executionId"]

    return _admit


# -- raw sockets: requests whose body is held back ---------------------------------

class BodyProbe:
    """An ASGI wrap recording, per request path, that the app has asked for the
    request's body (its first `receive()`); pass `wrap=probe` to make_server."""

    def __init__(self) -> None:
        self._reading: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, app):
        async def wrapped(scope, receive, send):
            if scope["type"] != "http":
                return await app(scope, receive, send)
            path = scope["path"]

            async def probed_receive():
                with self._lock:
                    self._reading.add(path)
                return await receive()

            return await app(scope, probed_receive, send)

        return wrapped

    def has_read(self, path: str) -> bool:
        with self._lock:
            return path in self._reading

    async def reading(self, path: str, timeout: float = 10) -> None:
        await wait_until(lambda: self.has_read(path), timeout=timeout, interval=0.005,
                         what=f"the app to ask for the body of {path}")


async def raw_connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def send_head(writer: asyncio.StreamWriter, method: str, path: str, token: Token | str | None,
                    length: int | None, extra: dict[str, str] | None = None) -> None:
    """Send the request line and headers only (Content-Length: `length`), no body."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if token is not None:
        lines.append(f"Authorization: {headers(token)['Authorization']}")
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    for k, v in (extra or {}).items():
        lines.append(f"{k}: {v}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()


async def read_response(reader: asyncio.StreamReader, timeout: float = 30
                        ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers lower-cased, body) of one response on a Connection: close socket."""
    raw = await asyncio.wait_for(reader.read(-1), timeout)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/1.1 "), raw[:200]
    status = int(lines[0].split(" ")[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return status, hdrs, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out


def error_code(body: bytes) -> str | None:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return json.loads(body)["error"]["code"]
    return None


@pytest_asyncio.fixture
async def workers(tenancy_settings: Settings, store) -> AsyncIterator[InProcessWorkers]:
    """In-process workers running tests/tenancy/flows_g.py (derived IDs, signal senders)."""
    fast = tenancy_settings.model_copy(update={**QUICK, "lease_seconds": 2, "renew_seconds": 0.5})
    running = InProcessWorkers(fast, load_workflows(["tests.tenancy.flows_g"]))
    try:
        yield running
    finally:
        await running.stop_all()
