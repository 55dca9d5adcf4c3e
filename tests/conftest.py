"""Shared fixtures: one Postgres server per test session, one migrated template
database per session, one fresh database per test (cloned from the template).

Where the server comes from, first match wins:
  1. TEST_DATABASE_URL (any reachable Postgres; its user must be able to CREATE DATABASE)
  2. a testcontainers PostgresContainer, when a Docker daemon answers: the image is
     POSTGRES_IMAGE (default postgres:16-alpine); the Ryuk reaper stays off (its image
     may not be pullable), the session's finalizer removes the container
  3. an embedded Postgres (pgserver wheel) under a fresh short temp dir
FENCEPOST_TEST_POSTGRES=env|docker|embedded forces one. Nothing is skipped: if
no server can be had, the fixture raises. Which server runs, and why an earlier
choice was passed over, is printed at the start of the run and warned in its summary.

Fixtures:
  pg_server          session  TestServer(url, kind, embedded, url_for(db))
  pg_server_url      session  str: admin URL of that server
  pg_admin           session  asyncpg.Connection to the admin database (session loop)
  template_database  session  str: name of the migrated template database
  database_url       function str: URL of a fresh, migrated database; dropped after the test
  empty_database_url function str: URL of a fresh, empty database (no migrations); dropped after
  settings           function app.settings.Settings for database_url (lease_seconds=30)
  pool               function asyncpg.Pool from app.db.create_pool(settings); closed after
  store_settings     function the Settings the `store` fixture uses: `settings`, unless a
                              folder's conftest overrides it with its own
  store              function ExecutionStore on `pool` with `store_settings`
  embedded_server    function a private, restartable EmbeddedPostgres (stop()/start()) on a
                              fresh temp dir, not migrated; stopped and deleted after
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from app.db import asyncpg_dsn, create_pool
from app.embedded import EmbeddedPostgres
from app.migrate import upgrade
from app.settings import Settings
from app.store import ExecutionStore

_CREATE_TIMES_MS: list[float] = []



# The API requires tokens by default (FENCEPOST_AUTH=enabled). Tests that are
# not about authentication run without it; tests/auth turns it on explicitly.
os.environ.setdefault("FENCEPOST_AUTH", "disabled")

def with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class TestServer:
    __test__ = False  # not a test class

    url: str
    kind: str  # "env" | "docker" | "embedded"
    embedded: EmbeddedPostgres | None = None
    _cleanup: list = field(default_factory=list, repr=False)

    def url_for(self, database: str) -> str:
        return with_database(self.url, database)


def _short_tempdir(prefix: str) -> Path:
    """A fresh, short directory for a throw-away server: on tmpfs (/dev/shm) when it has
    room (CREATE DATABASE is ~10 ms there, 100-300 ms on this VM's ext4 disk even with
    fsync off), else under the system temp dir."""
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 1 << 30:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=shm))
    base = tempfile.gettempdir()
    if len(base) > 40:  # keep <dir>/pg/.s.PGSQL.5432 well under the socket limit
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _docker_answers() -> str | None:
    """None when a Docker daemon answers, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except Exception as exc:
        return f"no Docker daemon answered ({type(exc).__name__}: {exc})"


def _postgres_image() -> str:
    return os.environ.get("POSTGRES_IMAGE", "").strip() or "postgres:16-alpine"


def _start_docker() -> TestServer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from testcontainers.core.config import testcontainers_config
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:
            from testcontainers.postgres import PostgresContainer
    # Ryuk (the reaper container) comes from a registry that may not answer; the
    # session's finalizer (container.stop) removes the container instead.
    testcontainers_config.ryuk_disabled = True
    # Throw-away data, as the embedded server's: in memory (CREATE DATABASE for each test
    # costs ~10 ms there, ~250 ms on disk) and, where the image takes arguments, no fsync.
    container = (
        PostgresContainer(_postgres_image(), driver=None)
        .with_command("postgres -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        .with_tmpfs_mount("/var/lib/postgresql/data")
    )
    try:
        container.start()
    except BaseException:
        with contextlib.suppress(Exception):
            container.stop()
        raise
    server = TestServer(container.get_connection_url(), "docker")
    server._cleanup.append(container.stop)
    return server


def _start_embedded() -> TestServer:
    root = _short_tempdir("fp-")
    pg = EmbeddedPostgres(root / "pg", durable=False)
    try:
        pg.start()
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    server = TestServer(pg.url, "embedded", embedded=pg)
    server._cleanup.append(lambda: shutil.rmtree(root, ignore_errors=True))
    server._cleanup.append(pg.stop)
    return server


def _say_which_server(config: pytest.Config, server: TestServer, passed_over: list[str]) -> None:
    """Print (at once, uncaptured) which Postgres the session uses and why an earlier
    choice was passed over; the reasons are also warned, so the summary lists them."""
    what = {"env": "TEST_DATABASE_URL", "docker": f"testcontainers {_postgres_image()}",
            "embedded": "embedded (pgserver)"}[server.kind]
    lines = [f"test database: {what}"] + [f"  passed over: {reason}" for reason in passed_over]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.ensure_newline()
            for line in lines:
                reporter.write_line(line, yellow=bool(passed_over))
    for reason in passed_over:
        warnings.warn(f"test database: {what}, because {reason}", stacklevel=2)


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[TestServer]:
    forced = os.environ.get("FENCEPOST_TEST_POSTGRES", "").strip().lower()
    env_url = os.environ.get("TEST_DATABASE_URL")
    errors: list[str] = []
    server: TestServer | None = None

    if forced in ("", "env") and env_url:
        server = TestServer(asyncpg_dsn(env_url), "env")
    elif forced == "env":
        errors.append("FENCEPOST_TEST_POSTGRES=env but TEST_DATABASE_URL is not set")
    if server is None and forced in ("", "docker"):
        problem = _docker_answers()
        if problem is None:
            try:
                server = _start_docker()
            except Exception as exc:
                errors.append(f"docker ({_postgres_image()}): {type(exc).__name__}: {exc}")
        else:
            errors.append(f"docker: {problem}")
    if server is None and forced in ("", "embedded"):
        try:
            server = _start_embedded()
        except Exception as exc:
            errors.append(f"embedded: {type(exc).__name__}: {exc}")
    if server is None:
        raise RuntimeError(
            "no Postgres for the tests. Set TEST_DATABASE_URL, start Docker, or install the "
            "embedded extra (pip install -e '.[embedded]'). Tried:\n  " + "\n  ".join(errors)
        )
    _say_which_server(pytestconfig, server, errors)
    try:
        yield server
    finally:
        for fn in reversed(server._cleanup):
            with contextlib.suppress(Exception):
                fn()


@pytest.fixture(scope="session")
def pg_server_url(pg_server: TestServer) -> str:
    return pg_server.url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pg_admin(pg_server_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_server_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _drop_database(admin: asyncpg.Connection, name: str) -> None:
    await admin.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def template_database(pg_server: TestServer, pg_admin: asyncpg.Connection) -> AsyncIterator[str]:
    name = f"fencepost_template_{uuid.uuid4().hex[:12]}"
    await pg_admin.execute(f"CREATE DATABASE {_quote_ident(name)}")
    try:
        await upgrade(pg_server.url_for(name))
        # Nobody may connect to it any more: CREATE DATABASE ... TEMPLATE needs it idle.
        await pg_admin.execute(
            f"ALTER DATABASE {_quote_ident(name)} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
        )
        yield name
    finally:
        with contextlib.suppress(Exception):
            await pg_admin.execute(f"ALTER DATABASE {_quote_ident(name)} WITH IS_TEMPLATE false")
        await _drop_database(pg_admin, name)


@pytest_asyncio.fixture
async def database_url(pg_server: TestServer, pg_admin: asyncpg.Connection,
                       template_database: str) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex}"
    started = time.perf_counter()
    await pg_admin.execute(
        f"CREATE DATABASE {_quote_ident(name)} TEMPLATE {_quote_ident(template_database)}"
    )
    _CREATE_TIMES_MS.append((time.perf_counter() - started) * 1000)
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_database(pg_admin, name)


@pytest_asyncio.fixture
async def empty_database_url(pg_server: TestServer, pg_admin: asyncpg.Connection) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex}"
    await pg_admin.execute(f"CREATE DATABASE {_quote_ident(name)} TEMPLATE template0")
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_database(pg_admin, name)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, lease_seconds=30)


@pytest_asyncio.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(settings)
    try:
        yield p
    finally:
        with contextlib.suppress(Exception):
            await p.close()


@pytest.fixture
def store_settings(settings: Settings) -> Settings:
    return settings


@pytest.fixture
def store(pool: asyncpg.Pool, store_settings: Settings) -> ExecutionStore:
    return ExecutionStore.from_settings(pool, store_settings)


@pytest.fixture
def embedded_server() -> Iterator[EmbeddedPostgres]:
    root = _short_tempdir("fpe-")
    pg = EmbeddedPostgres(root / "pg", durable=False)
    try:
        pg.start()
        yield pg
    finally:
        with contextlib.suppress(Exception):
            pg.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _CREATE_TIMES_MS:
        terminalreporter.write_line(
            f"per-test database: {len(_CREATE_TIMES_MS)} created from template, "
            f"median {statistics.median(_CREATE_TIMES_MS):.1f} ms, "
            f"max {max(_CREATE_TIMES_MS):.1f} ms"
        )
