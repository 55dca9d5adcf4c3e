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

FENCEPOST_TEST_POSTGRES=citus runs on a Citus cluster: TEST_CITUS_URL is its
coordinator's DSN (any database there with the citus extension and its worker nodes
registered, e.g. `postgres` as ../shared/citus/cluster leaves it; a superuser). Without
TEST_CITUS_URL the run stops at once. A Citus cluster is per database, so each database
the fixtures make is made on every node (the coordinator's and each worker's server,
the workers read from the coordinator's pg_dist_node): the session's template is created
on every node, gets the citus extension on every node, its coordinator registers itself
and the workers, and is migrated and distributed (`upgrade(url, citus=True)`); each test's
database is then `CREATE DATABASE ... TEMPLATE` of it on every node at once, which clones
the coordinator's metadata and the workers' shards together (pg_dist_node holds host and
port, not a database name: a clone's coordinator reaches the same-named clone on each
worker). In this mode only tests marked `citus` run; the others are deselected (counted in
the summary), unless --citus-all. Outside it, tests/citus/ (which needs a cluster) is
skipped with the reason.

Fixtures:
  pg_server          session  TestServer(url, kind, embedded, url_for(db), nodes): nodes is
                              each server's admin URL, the coordinator first (one unless
                              Citus)
  pg_server_url      session  str: admin URL of that server
  pg_admin           session  asyncpg.Connection to the admin database (session loop); on
                              Citus the coordinator's
  pg_node_admins     session  [pg_admin] + an admin connection to each Citus worker
  template_database  session  str: name of the migrated template database
  database_url       function str: URL of a fresh, migrated database; dropped after the test
  make_database_url  function `await make_database_url()`: one more such URL; all dropped after
  empty_database_url function str: URL of a fresh, empty database (no migrations); dropped after.
                              On Citus: citus on every node, the nodes registered
  settings           function app.settings.Settings for database_url (lease_seconds=30)
  pool               function asyncpg.Pool from app.db.create_pool(settings); closed after
  store_settings     function the Settings the `store` fixture uses: `settings`, unless a
                              folder's conftest overrides it with its own
  store              function ExecutionStore on `pool` with `store_settings`
  embedded_server    function a private, restartable EmbeddedPostgres (stop()/start()) on a
                              fresh temp dir, not migrated; stopped and deleted after
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
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
from tests.support.pools import close_pool

_CREATE_TIMES_MS: list[float] = []
# Citus: the CREATE DATABASE strategy each template is cloned with, and what choosing
# it measured (see _faster_strategy).
_CLONE_STRATEGY: dict[str, str] = {}
_DROP_TIMES_MS: list[float] = []
_BUSY_DROPS: list[str] = []  # a DROP DATABASE that had to be tried again
_STRATEGY_CHOICE: list[str] = []
_TESTS_DIR = Path(__file__).resolve().parent
# Tests of the Citus bed itself: they need a cluster, and are skipped without one.
_CITUS_ONLY_DIR = _TESTS_DIR / "citus"
_DESELECTED_FOR_CITUS = pytest.StashKey[int]()
_SKIPPED_WITHOUT_CITUS = pytest.StashKey[int]()


def _forced_server() -> str:
    return os.environ.get("FENCEPOST_TEST_POSTGRES", "").strip().lower()


def citus_mode() -> bool:
    """The run is on a Citus cluster (FENCEPOST_TEST_POSTGRES=citus)."""
    return _forced_server() == "citus"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus-all", action="store_true", default=False,
        help="with FENCEPOST_TEST_POSTGRES=citus, also run the tests not marked `citus` "
             "(to see which fail on Citus); they are deselected otherwise")


def pytest_configure(config: pytest.Config) -> None:
    # Fails the whole run at once (as the `env` choice does when its URL is missing, but
    # before any test): a Citus run with no cluster must not look like a passing one.
    if citus_mode() and not os.environ.get("TEST_CITUS_URL", "").strip():
        raise pytest.UsageError(
            "FENCEPOST_TEST_POSTGRES=citus but TEST_CITUS_URL is not set: set it to a Citus "
            "coordinator's DSN (e.g. postgresql://postgres@127.0.0.1:9700/postgres)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if citus_mode():
        if config.getoption("--citus-all"):
            return
        kept = [item for item in items if item.get_closest_marker("citus") is not None]
        deselected = [item for item in items if item.get_closest_marker("citus") is None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
        config.stash[_DESELECTED_FOR_CITUS] = len(deselected)
        return
    skip = pytest.mark.skip(
        reason="needs a Citus cluster: runs with FENCEPOST_TEST_POSTGRES=citus and "
               "TEST_CITUS_URL (make test's Citus variant)")
    skipped = 0
    for item in items:
        if item.path.is_relative_to(_CITUS_ONLY_DIR):
            item.add_marker(skip)
            skipped += 1
    config.stash[_SKIPPED_WITHOUT_CITUS] = skipped


# The API requires tokens by default (FENCEPOST_AUTH=enabled). Tests that are
# not about authentication run without it; tests/auth turns it on explicitly.
os.environ.setdefault("FENCEPOST_AUTH", "disabled")

def with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _url_at(url: str, host: str, port: int) -> str:
    """`url` (its user, password, database, options) on another server."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{hostport}" if userinfo else hostport))


@dataclass
class TestServer:
    __test__ = False  # not a test class

    url: str
    kind: str  # "env" | "docker" | "embedded" | "citus"
    embedded: EmbeddedPostgres | None = None
    _cleanup: list = field(default_factory=list, repr=False)
    # Citus: each node as pg_dist_node names it (host, port), the coordinator first.
    citus_nodes: list[tuple[str, int]] = field(default_factory=list)

    def url_for(self, database: str) -> str:
        return with_database(self.url, database)

    @property
    def nodes(self) -> list[str]:
        """Each server's admin URL, the coordinator first: a database the tests use exists
        on every one of them (one server unless Citus)."""
        if not self.citus_nodes:
            return [self.url]
        return [self.url] + [_url_at(self.url, host, port) for host, port in self.citus_nodes[1:]]

    def node_url_for(self, node: int, database: str) -> str:
        return with_database(self.nodes[node], database)


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


async def _citus_nodes(url: str) -> list[tuple[str, int]]:
    """The cluster's primary nodes as the coordinator at `url` registered them, the
    coordinator first; raises, saying why, when `url` is not a usable Citus coordinator."""
    conn = await asyncpg.connect(url)
    try:
        if await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'citus'") is None:
            raise RuntimeError(f"TEST_CITUS_URL ({url}): its database has no citus extension")
        if not await conn.fetchval("SELECT citus_is_coordinator()"):
            raise RuntimeError(f"TEST_CITUS_URL ({url}) is not a Citus coordinator")
        rows = await conn.fetch(
            "SELECT groupid, nodename, nodeport FROM pg_dist_node "
            "WHERE noderole = 'primary' AND isactive ORDER BY groupid, nodeid")
    finally:
        await conn.close()
    coordinator = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] == 0]
    workers = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] != 0]
    if not workers:
        raise RuntimeError(f"TEST_CITUS_URL ({url}): its pg_dist_node lists no worker node")
    if not coordinator:  # never registered itself: the nodes reach it where the URL does
        parts = urlsplit(url)
        coordinator = [(parts.hostname or "127.0.0.1", parts.port or 5432)]
    return coordinator + workers


def _start_citus(url: str) -> TestServer:
    loop = asyncio.new_event_loop()  # the session's loop is pytest-asyncio's, not started yet
    try:
        nodes = loop.run_until_complete(_citus_nodes(url))
    finally:
        loop.close()
    return TestServer(url, "citus", citus_nodes=nodes)


def _say_which_server(config: pytest.Config, server: TestServer, passed_over: list[str]) -> None:
    """Print (at once, uncaptured) which Postgres the session uses and why an earlier
    choice was passed over; the reasons are also warned, so the summary lists them."""
    what = {"env": "TEST_DATABASE_URL", "docker": f"testcontainers {_postgres_image()}",
            "embedded": "embedded (pgserver)", "citus": f"Citus ({server.url})"}[server.kind]
    lines = [f"test database: {what}"] + [f"  passed over: {reason}" for reason in passed_over]
    if server.citus_nodes:
        lines.append("  Citus workers: " + ", ".join(
            f"{host}:{port}" for host, port in server.citus_nodes[1:]))
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
    forced = _forced_server()
    env_url = os.environ.get("TEST_DATABASE_URL")
    errors: list[str] = []
    server: TestServer | None = None

    if forced == "citus":
        citus_url = os.environ.get("TEST_CITUS_URL", "").strip()
        if not citus_url:
            errors.append("FENCEPOST_TEST_POSTGRES=citus but TEST_CITUS_URL is not set")
        else:
            try:
                server = _start_citus(asyncpg_dsn(citus_url))
            except Exception as exc:
                errors.append(f"citus: {type(exc).__name__}: {exc}")
    elif forced in ("", "env") and env_url:
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
    if server is None and forced == "citus":
        raise RuntimeError("no Citus cluster for the tests (FENCEPOST_TEST_POSTGRES=citus): "
                           + "; ".join(errors))
    if server is None:
        raise RuntimeError(
            "no Postgres for the tests. Set TEST_DATABASE_URL, start Docker, or install the "
            "embedded extra (pip install -e '.[embedded]'). Tried:\n  " + "\n  ".join(errors)
        )
    _say_which_server(pytestconfig, server, [] if forced == "citus" else errors)
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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pg_node_admins(pg_server: TestServer,
                         pg_admin: asyncpg.Connection) -> AsyncIterator[list[asyncpg.Connection]]:
    if pg_server.kind == "citus" and await pg_admin.fetchval(
            "SELECT 1 FROM pg_settings WHERE name = 'citus.enable_create_database_propagation'"):
        # Each node's database is made (and dropped) by its own statement below: the
        # coordinator's CREATE/DROP DATABASE must not also run on the workers.
        await pg_admin.execute("SET citus.enable_create_database_propagation TO off")
    workers = [await asyncpg.connect(url) for url in pg_server.nodes[1:]]
    try:
        yield [pg_admin, *workers]
    finally:
        for conn in workers:
            await conn.close()


async def _end_sessions(admin: asyncpg.Connection, name: str, wait_ms: int) -> None:
    """End every other session on `name` (on `admin`'s server), waiting up to `wait_ms`
    for each to be gone."""
    await admin.execute(
        "SELECT pg_terminate_backend(pid, $2) FROM pg_stat_activity "
        "WHERE datname = $1 AND pid <> pg_backend_pid()", name, wait_ms)


async def _drop_database(admin: asyncpg.Connection, name: str, tries: int = 1) -> None:
    for attempt in range(1, tries + 1):
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")
            return
        except asyncpg.ObjectInUseError as exc:
            # A process FORCE did not end within the 5 s DROP waits (on Citus, a
            # maintenance daemon: it ends only between its tasks).
            if attempt == tries:
                holders = await admin.fetch(
                    "SELECT pid, backend_type, application_name, backend_start, state, "
                    "wait_event_type, wait_event "
                    "FROM pg_stat_activity WHERE datname = $1", name)
                raise RuntimeError(f"could not drop database {name} after {tries} tries; "
                                   f"still connected: {[dict(h) for h in holders]}") from exc
            _BUSY_DROPS.append(name)
            # Outside the DROP (which holds the database's lock, so that a daemon's
            # connection to this copy waits for it), end the holders and wait for them.
            await _end_sessions(admin, name, wait_ms=10000)


async def _drop_everywhere(admins: Sequence[asyncpg.Connection], name: str) -> None:
    """Drop `name` on every node, one node after another: the coordinator's first (its
    sessions and maintenance daemon hold connections to the workers' copies), then each
    worker's. Every node is tried; the first error is raised after."""
    if len(admins) > 1:
        # Citus: a connection to a copy starts that copy's maintenance daemon (and the
        # coordinator's daemon connects to the workers' every few seconds); one starting
        # while DROP ... FORCE ends the others keeps the database busy ("being accessed
        # by other users" after a 5 s wait). Refused connections start none (the daemon
        # does not bypass datallowconn).
        for admin in admins:
            with contextlib.suppress(asyncpg.InvalidCatalogNameError):
                await admin.execute(
                    f"ALTER DATABASE {_quote_ident(name)} WITH ALLOW_CONNECTIONS false")
    tries = 3 if len(admins) > 1 else 1
    started = time.perf_counter()
    errors: list[BaseException] = []
    # Never two nodes at once. A DROP holds its database's lock while it waits (5 s) for
    # the copy's maintenance daemon to end, and a daemon ends only between its tasks,
    # some of which connect to the other nodes' copies; a connection to a copy whose DROP
    # holds that lock waits for it. Two workers dropped at once can so wait for each
    # other until both DROPs give up, try after try (the likeliest reading of a CI failure:
    # three tries, 15 s, the daemon still there; not reproduced here in 370 stress drops).
    # With one DROP at a time, a daemon's connection elsewhere is refused at once (no
    # connections allowed, or no database), so it reaches its end.
    for admin in admins:
        try:
            await _drop_database(admin, name, tries)
        except Exception as exc:
            errors.append(exc)
    _DROP_TIMES_MS.append((time.perf_counter() - started) * 1000)
    if errors:
        raise errors[0]


async def _create_everywhere(admins: Sequence[asyncpg.Connection], name: str,
                             template: str | None = None, strategy: str | None = None) -> None:
    """`name` on every node at once (from `template`, which must exist on each); on a
    failure none is left behind."""
    statement = f"CREATE DATABASE {_quote_ident(name)}"
    if template is not None:
        statement += f" TEMPLATE {_quote_ident(template)}"
    if strategy is not None:
        statement += f" STRATEGY {strategy}"
    results = await asyncio.gather(*(a.execute(statement) for a in admins),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        with contextlib.suppress(Exception):
            await _drop_everywhere(admins, name)
        raise failed[0]


async def _make_citus_database(server: TestServer, admins: Sequence[asyncpg.Connection],
                               name: str) -> None:
    """A new database `name` that is a Citus cluster of its own: made on every node, the
    citus extension in each, its coordinator registered and the workers added."""
    await _create_everywhere(admins, name)

    async def create_extension(url: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE EXTENSION citus")
        finally:
            await conn.close()

    # Each worker's copy needs the extension before the coordinator adds it.
    await asyncio.gather(*(create_extension(server.node_url_for(i, name))
                           for i in range(len(admins))))
    conn = await asyncpg.connect(server.url_for(name))
    try:
        host, port = server.citus_nodes[0]
        await conn.execute("SELECT citus_set_coordinator_host($1, $2)", host, port)
        for host, port in server.citus_nodes[1:]:
            await conn.execute("SELECT citus_add_node($1, $2)", host, port)
    finally:
        await conn.close()


async def _freeze_template(admins: Sequence[asyncpg.Connection], name: str) -> None:
    """Make `name` a template on every node: no new connections, and none left, since
    CREATE DATABASE ... TEMPLATE needs it idle. On Citus, each copy's maintenance daemon
    (and the coordinator daemon's connections to the workers) stays connected until
    ended; with connections refused, nothing starts them again."""
    for admin in admins:
        await admin.execute(
            f"ALTER DATABASE {_quote_ident(name)} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
    for admin in admins:  # the coordinator first: its daemon holds the workers' sessions
        await _end_sessions(admin, name, wait_ms=5000)


async def _faster_strategy(admins: Sequence[asyncpg.Connection], template: str) -> str:
    """The faster way for this cluster to clone `template`, by two clones each way.
    A Citus template is ~12 MB per node (its catalog alone) plus ~0.2 MB per shard:
    WAL_LOG (the default) writes all of it to the WAL, FILE_COPY copies the files
    after a checkpoint. Measured on a 2-core VM (1 coordinator + 2 workers, 32 shards):
    on tmpfs FILE_COPY ~105 ms and WAL_LOG ~175 ms for the three nodes at once; on a
    busy disk with fsync WAL_LOG ~1.8 s and FILE_COPY ~3.3 s."""
    medians: dict[str, float] = {}
    for strategy in ("WAL_LOG", "FILE_COPY"):
        times = []
        for _ in range(2):
            name = f"t_{uuid.uuid4().hex}"
            started = time.perf_counter()
            await _create_everywhere(admins, name, template, strategy)
            times.append((time.perf_counter() - started) * 1000)
            await _drop_everywhere(admins, name)
        medians[strategy] = statistics.median(times)
    chosen = min(medians, key=lambda strategy: medians[strategy])
    _STRATEGY_CHOICE.append(
        f"STRATEGY {chosen} (measured at the start: "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in medians.items()) + ")")
    return chosen


async def _unfreeze_and_drop(admins: Sequence[asyncpg.Connection], name: str) -> None:
    for admin in admins:
        with contextlib.suppress(Exception):
            await admin.execute(f"ALTER DATABASE {_quote_ident(name)} WITH IS_TEMPLATE false")
    await _drop_everywhere(admins, name)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def template_database(pg_server: TestServer,
                            pg_node_admins: list[asyncpg.Connection]) -> AsyncIterator[str]:
    name = f"fencepost_template_{uuid.uuid4().hex[:12]}"
    try:
        if pg_server.kind == "citus":
            await _make_citus_database(pg_server, pg_node_admins, name)
            await upgrade(pg_server.url_for(name), citus=True)
        else:
            await _create_everywhere(pg_node_admins, name)
            await upgrade(pg_server.url_for(name))
        await _freeze_template(pg_node_admins, name)
        if pg_server.kind == "citus":
            _CLONE_STRATEGY[name] = await _faster_strategy(pg_node_admins, name)
        yield name
    finally:
        await _unfreeze_and_drop(pg_node_admins, name)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def empty_template_database(
        pg_server: TestServer,
        pg_node_admins: list[asyncpg.Connection]) -> AsyncIterator[str | None]:
    """On Citus, the template of empty_database_url: a Citus cluster of its own with no
    schema. None elsewhere (empty_database_url is then a copy of template0)."""
    if pg_server.kind != "citus":
        yield None
        return
    name = f"fencepost_empty_{uuid.uuid4().hex[:12]}"
    try:
        await _make_citus_database(pg_server, pg_node_admins, name)
        await _freeze_template(pg_node_admins, name)
        yield name
    finally:
        await _unfreeze_and_drop(pg_node_admins, name)


async def _fresh_database(server: TestServer, admins: Sequence[asyncpg.Connection],
                          template: str) -> str:
    """A new database cloned from `template` on every node at once; its name."""
    name = f"t_{uuid.uuid4().hex}"
    started = time.perf_counter()
    await _create_everywhere(admins, name, template, _CLONE_STRATEGY.get(template))
    _CREATE_TIMES_MS.append((time.perf_counter() - started) * 1000)
    return name


@pytest_asyncio.fixture
async def database_url(pg_server: TestServer, pg_node_admins: list[asyncpg.Connection],
                       template_database: str) -> AsyncIterator[str]:
    name = await _fresh_database(pg_server, pg_node_admins, template_database)
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_everywhere(pg_node_admins, name)


@pytest_asyncio.fixture
async def make_database_url(pg_server: TestServer, pg_node_admins: list[asyncpg.Connection],
                            template_database: str) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """`await make_database_url()`: the URL of one more fresh, migrated database (as
    database_url's, on every node); each is dropped after the test."""
    made: list[str] = []

    async def make() -> str:
        made.append(await _fresh_database(pg_server, pg_node_admins, template_database))
        return pg_server.url_for(made[-1])

    try:
        yield make
    finally:
        for name in made:
            await _drop_everywhere(pg_node_admins, name)


@pytest_asyncio.fixture
async def empty_database_url(pg_server: TestServer, pg_node_admins: list[asyncpg.Connection],
                             empty_template_database: str | None) -> AsyncIterator[str]:
    if empty_template_database is not None:
        name = await _fresh_database(pg_server, pg_node_admins, empty_template_database)
    else:
        name = f"t_{uuid.uuid4().hex}"
        await _create_everywhere(pg_node_admins, name, "template0")
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_everywhere(pg_node_admins, name)


@pytest.fixture
def settings(database_url: str) -> Settings:
    # On Citus every claim looks in every shard group: a test claims right
    # after it admits, with no listener to end a group's idle skip (that
    # skip is tested on its own: tests/store/test_claim_groups.py).
    return Settings(database_url=database_url, lease_seconds=30,
                    **({"claim_recheck_seconds": 0} if citus_mode() else {}))


@pytest_asyncio.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(settings)
    try:
        yield p
    finally:
        await close_pool(p)


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
        where = " on every Citus node at once" if citus_mode() else ""
        where += "".join(f", {choice}" for choice in _STRATEGY_CHOICE)
        terminalreporter.write_line(
            f"per-test database: {len(_CREATE_TIMES_MS)} created from template{where}, "
            f"median {statistics.median(_CREATE_TIMES_MS):.1f} ms, "
            f"max {max(_CREATE_TIMES_MS):.1f} ms"
        )
    if _DROP_TIMES_MS and citus_mode():
        terminalreporter.write_line(
            f"databases: {len(_DROP_TIMES_MS)} dropped on every Citus node, median "
            f"{statistics.median(_DROP_TIMES_MS):.1f} ms, max {max(_DROP_TIMES_MS):.1f} ms, "
            f"{len(_BUSY_DROPS)} tried again (busy)")
    deselected = config.stash.get(_DESELECTED_FOR_CITUS, 0)
    if deselected:
        terminalreporter.write_line(
            f"citus: {deselected} tests deselected: not yet converted to run on Citus",
            yellow=True)
    skipped = config.stash.get(_SKIPPED_WITHOUT_CITUS, 0)
    if skipped:
        terminalreporter.write_line(
            f"citus: {skipped} tests (tests/citus) skipped: no Citus cluster in this run "
            "(FENCEPOST_TEST_POSTGRES=citus with TEST_CITUS_URL runs them)", yellow=True)
